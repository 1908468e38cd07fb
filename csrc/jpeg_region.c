/*
 * fastdata._jpeg_region: decode only the region of a JPEG that a crop needs, at a reduced DCT scale.
 *
 * libjpeg-turbo can (a) scale while decoding (scale_num/8, 1 <= scale_num <= 8: the IDCT emits fewer pixels),
 * (b) skip the IDCT, upsampling and colour conversion of the columns left and right of a region
 * (jpeg_crop_scanline), (c) skip the IDCT and colour conversion of the rows above it (jpeg_skip_scanlines),
 * and (d) stop after its last row. OpenCV, Pillow and torchvision expose none of (b)-(d). This module drives
 * the libjpeg API for that, writing the region straight into a caller-owned uint8 H x W x 3 buffer, with the
 * GIL released.
 *
 * It links to no library at build time (so it builds with a C compiler and Python's headers alone): `load()`
 * dlopen()s a libjpeg-turbo that is already installed (Pillow's wheels ship one) and resolves the few entry
 * points it needs into a capsule that every call takes, so several libraries can be tried (and proved) side by
 * side without one replacing another; `linked_library()` names the libjpeg an already loaded extension (Pillow's
 * PIL._imaging) is linked against. Every decode checks the JPEG header's own width x height against a pixel limit
 * before decoding anything: stored metadata may lie. The headers in csrc/libjpeg-turbo are libjpeg-turbo's (libjpeg API/ABI 6.2, stable across
 * libjpeg-turbo 1.5-3.x); jpeg_CreateDecompress() checks the struct size and version, so a mismatched library
 * is refused with an error instead of misbehaving. jpeg_restart.c, in the same module, adds the lossless
 * restart-marker rewrite and the assembly of sub-JPEGs (the capsule layout is in jpeg_api.h).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* dladdr */
#include <Python.h>

#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_api.h"
#include "jerror.h"

/* Columns decoded beyond the region's right edge, so that its last column is not the crop's edge for chroma
 * upsampling: one chroma sample is at most 4 pixels wide (4:1:1). With none, region and whole decode differ at the
 * edge (tests/test_jpeg_region.py); 64 cost about 1% of region decode time more than 8. */
#define EDGE_MARGIN 8
#define ROWS_PER_CALL 16

/* The library is never dlclose()d: a decode in another thread may still be using it. */
static void free_api(PyObject *capsule) { free(PyCapsule_GetPointer(capsule, CAPSULE_NAME)); }

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error_exit(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

/* Warnings are not fatal (e.g. "extraneous bytes before marker", common in real files and accepted by OpenCV and
 * Pillow), except running out of data: a truncated image is an error, as it is for OpenCV. Nothing is printed. */
static void on_emit_message(j_common_ptr cinfo, int msg_level) {
    if (msg_level < 0) {
        if (cinfo->err->msg_code == JWRN_JPEG_EOF) on_error_exit(cinfo);
        cinfo->err->num_warnings++;
    }
}

static void on_output_message(j_common_ptr cinfo) { (void)cinfo; }

#define RESOLVE(field, type, name)                                    \
    do {                                                              \
        api.field = (type)dlsym(handle, name);                        \
        if (api.field == NULL) {                                      \
            dlclose(handle);                                          \
            PyErr_Format(PyExc_OSError, "%s: no symbol %s", path, name); \
            return NULL;                                              \
        }                                                             \
    } while (0)

static PyObject *load(PyObject *module, PyObject *arg) {
    (void)module;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL) return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
        return NULL;
    }
    jpeg_api api;
    api.handle = handle;
    RESOLVE(std_error, std_error_fn, "jpeg_std_error");
    RESOLVE(create, create_fn, "jpeg_CreateDecompress");
    RESOLVE(destroy, destroy_fn, "jpeg_destroy_decompress");
    RESOLVE(mem_src, mem_src_fn, "jpeg_mem_src");
    RESOLVE(read_header, read_header_fn, "jpeg_read_header");
    RESOLVE(start, start_fn, "jpeg_start_decompress");
    RESOLVE(crop, crop_fn, "jpeg_crop_scanline");
    RESOLVE(skip, skip_fn, "jpeg_skip_scanlines");
    RESOLVE(read, read_fn, "jpeg_read_scanlines");
    /* the lossless rewrite's entry points (jpeg_restart.c): optional, so a decode-only library still loads */
    api.save_markers = (save_markers_fn)dlsym(handle, "jpeg_save_markers");
    api.read_coefficients = (read_coefficients_fn)dlsym(handle, "jpeg_read_coefficients");
    api.create_compress = (create_compress_fn)dlsym(handle, "jpeg_CreateCompress");
    api.destroy_compress = (destroy_compress_fn)dlsym(handle, "jpeg_destroy_compress");
    api.copy_critical = (copy_critical_fn)dlsym(handle, "jpeg_copy_critical_parameters");
    api.write_coefficients = (write_coefficients_fn)dlsym(handle, "jpeg_write_coefficients");
    api.write_marker = (write_marker_fn)dlsym(handle, "jpeg_write_marker");
    api.finish_compress = (finish_compress_fn)dlsym(handle, "jpeg_finish_compress");
    api.has_transcode = api.save_markers && api.read_coefficients && api.create_compress && api.destroy_compress &&
                        api.copy_critical && api.write_coefficients && api.write_marker && api.finish_compress;
    jpeg_api *copy = malloc(sizeof(jpeg_api));
    if (copy == NULL) return PyErr_NoMemory();
    *copy = api;
    PyObject *capsule = PyCapsule_New(copy, CAPSULE_NAME, free_api);
    if (capsule == NULL) free(copy);
    return capsule;
}

/* The file of the library that provides `symbol` to the already loaded shared object `path` (itself or one of the
 * libraries it is linked against, searched as the dynamic linker does), or None. */
static PyObject *linked_library(PyObject *module, PyObject *args) {
    (void)module;
    const char *path, *symbol;
    if (!PyArg_ParseTuple(args, "ss", &path, &symbol)) return NULL;
    void *handle = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);  /* only if loaded: never loads it */
    if (handle == NULL) Py_RETURN_NONE;
    void *address = dlsym(handle, symbol);
    Dl_info info;
    PyObject *result = NULL;
    if (address != NULL && dladdr(address, &info) && info.dli_fname != NULL)
        result = PyUnicode_DecodeFSDefault(info.dli_fname);
    dlclose(handle);  /* drops the reference dlopen just took */
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

/* `n` >= 0 with thousands separators ("89,478,485"), as the Python side writes the limit. */
static void format_count(long long n, char *out, size_t size) {
    char digits[32];
    int len = snprintf(digits, sizeof(digits), "%lld", n), j = 0;
    for (int i = 0; i < len && (size_t)j + 2 < size; i++) {
        if (i > 0 && (len - i) % 3 == 0) out[j++] = ',';
        out[j++] = digits[i];
    }
    out[j] = '\0';
}

/* The decode proper, without the GIL. Returns 0, or -1 with `message` set. */
static int decode_region(const jpeg_api *api, const unsigned char *data, size_t size, int scale_num, int left,
                         int top, int width, int height, int bgr, long long max_pixels, int fast,
                         unsigned char *out, char *message) {
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    unsigned char *volatile row = NULL;

    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = api->std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.output_message = on_output_message;
    err.pub.emit_message = on_emit_message;
    err.message[0] = '\0';
    if (setjmp(err.escape)) {
        snprintf(message, JMSG_LENGTH_MAX, "libjpeg-turbo: %s", err.message);
        api->destroy(&cinfo);
        free(row);
        return -1;
    }
    api->create(&cinfo, JPEG_LIB_VERSION, sizeof(struct jpeg_decompress_struct));
    api->mem_src(&cinfo, data, (unsigned long)size);
    api->read_header(&cinfo, TRUE);
    /* the header's own size, before anything is allocated for the image (the caller's was the stored one) */
    if ((long long)cinfo.image_width * (long long)cinfo.image_height > max_pixels) {
        char limit[40];
        format_count(max_pixels, limit, sizeof(limit));
        snprintf(message, JMSG_LENGTH_MAX, "refused: the JPEG header says %ux%u pixels, over the limit of %s",
                 cinfo.image_width, cinfo.image_height, limit);
        api->destroy(&cinfo);
        return -1;
    }
    if (cinfo.num_components != 1 && cinfo.num_components != 3) {
        snprintf(message, JMSG_LENGTH_MAX, "unsupported JPEG with %d components (CMYK?)", cinfo.num_components);
        api->destroy(&cinfo);
        return -1;
    }
    cinfo.scale_num = (unsigned int)scale_num;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = bgr ? JCS_EXT_BGR : JCS_EXT_RGB;
    if (fast & 1) cinfo.dct_method = JDCT_IFAST;
    if (fast & 2) cinfo.do_fancy_upsampling = FALSE;
    api->start(&cinfo);
    if (left < 0 || top < 0 || (JDIMENSION)(left + width) > cinfo.output_width ||
        (JDIMENSION)(top + height) > cinfo.output_height) {
        snprintf(message, JMSG_LENGTH_MAX, "region %dx%d at (%d, %d) outside the %ux%u image at scale %d/8",
                 width, height, left, top, cinfo.output_width, cinfo.output_height, scale_num);
        api->destroy(&cinfo);
        return -1;
    }
    /* Decode a few columns beyond the region on each side: libjpeg widens the crop to the iMCU boundary at or
     * left of its start, and chroma upsampling treats a crop's first and last columns as image edges, so the
     * region's own edge columns would differ from a full decode if they lay on the crop's edges. */
    JDIMENSION x_offset = left > 0 ? (JDIMENSION)left - 1 : 0;
    JDIMENSION x_end = (JDIMENSION)(left + width) + EDGE_MARGIN;
    if (x_end > cinfo.output_width) x_end = cinfo.output_width;
    JDIMENSION crop_width = x_end - x_offset;
    if (crop_width < cinfo.output_width) {
        api->crop(&cinfo, &x_offset, &crop_width);  /* moves x_offset left to an iMCU boundary */
    } else {
        x_offset = 0;
    }
    size_t skip_bytes = (size_t)(left - (int)x_offset) * 3, row_bytes = (size_t)width * 3;
    if (top > 0) api->skip(&cinfo, (JDIMENSION)top);
    /* Read up to ROWS_PER_CALL rows per call: straight into `out` when the decoded width is the region's,
     * else into a block of full decoded rows, then each row's region bytes into `out`. */
    int direct = skip_bytes == 0 && crop_width == (JDIMENSION)width;
    size_t decoded_row_bytes = (size_t)crop_width * 3;
    if (!direct) {
        row = malloc(decoded_row_bytes * ROWS_PER_CALL);
        if (row == NULL) {
            snprintf(message, JMSG_LENGTH_MAX, "out of memory for %d rows of %u pixels", ROWS_PER_CALL, crop_width);
            api->destroy(&cinfo);
            return -1;
        }
    }
    JSAMPROW targets[ROWS_PER_CALL];
    for (int y = 0; y < height;) {
        int want = height - y < ROWS_PER_CALL ? height - y : ROWS_PER_CALL;
        for (int i = 0; i < want; i++)
            targets[i] = direct ? out + (size_t)(y + i) * row_bytes : row + (size_t)i * decoded_row_bytes;
        JDIMENSION got = api->read(&cinfo, targets, (JDIMENSION)want);
        if (got == 0) {
            snprintf(message, JMSG_LENGTH_MAX, "decoder stopped at row %d of %d", top + y, top + height);
            api->destroy(&cinfo);
            free(row);
            return -1;
        }
        if (!direct)
            for (JDIMENSION i = 0; i < got; i++)
                memcpy(out + (size_t)(y + i) * row_bytes, row + i * decoded_row_bytes + skip_bytes, row_bytes);
        y += (int)got;
    }
    api->destroy(&cinfo);  /* the rows below the region are never decoded */
    free(row);
    return 0;
}

static PyObject *decode_into(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *capsule;
    Py_buffer src, dst;
    int scale_num, left, top, bgr, fast = 0;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, "Oy*w*iiipL|i", &capsule, &src, &dst, &scale_num, &left, &top, &bgr, &max_pixels,
                          &fast))
        return NULL;
    PyObject *result = NULL;
    const jpeg_api *api = get_api(capsule);
    if (api == NULL) goto done;
    if (scale_num < 1 || scale_num > 8) {
        PyErr_Format(PyExc_ValueError, "scale_num must be 1..8 (eighths), got %d", scale_num);
        goto done;
    }
    PyObject *shape = PyObject_GetAttrString(PyTuple_GET_ITEM(args, 2), "shape");
    if (shape == NULL) goto done;
    int height = -1, width = -1, channels = -1;
    int ok = PyArg_ParseTuple(shape, "iii", &height, &width, &channels);
    Py_DECREF(shape);
    if (!ok || channels != 3 || height < 1 || width < 1 || dst.len != (Py_ssize_t)height * width * 3 ||
        !PyBuffer_IsContiguous(&dst, 'C')) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous uint8 array of shape (H, W, 3)");
        goto done;
    }
    char message[JMSG_LENGTH_MAX];
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode_region(api, (const unsigned char *)src.buf, (size_t)src.len, scale_num, left, top, width,
                           height, bgr, max_pixels, fast, (unsigned char *)dst.buf, message);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError, message);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *header(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *capsule;
    Py_buffer src;
    int scale_num = 8;
    if (!PyArg_ParseTuple(args, "Oy*|i", &capsule, &src, &scale_num)) return NULL;
    const jpeg_api *api = get_api(capsule);
    if (api == NULL) {
        PyBuffer_Release(&src);
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = api->std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.output_message = on_output_message;
    err.pub.emit_message = on_emit_message;
    if (setjmp(err.escape)) {
        api->destroy(&cinfo);
        PyBuffer_Release(&src);
        PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", err.message);
        return NULL;
    }
    api->create(&cinfo, JPEG_LIB_VERSION, sizeof(struct jpeg_decompress_struct));
    api->mem_src(&cinfo, (const unsigned char *)src.buf, (unsigned long)src.len);
    api->read_header(&cinfo, TRUE);
    cinfo.scale_num = (unsigned int)scale_num;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = JCS_EXT_RGB;
    /* jpeg_calc_output_dimensions is not resolved: start_decompress computes the same, and header() is for tests */
    api->start(&cinfo);
    PyObject *result = Py_BuildValue("(IIi)", cinfo.output_width, cinfo.output_height, cinfo.num_components);
    api->destroy(&cinfo);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef methods[] = {
    {"load", load, METH_O,
     "load(path) -> api: dlopen a libjpeg-turbo (libjpeg API 6.2) and resolve its entry points (a capsule)."},
    {"linked_library", linked_library, METH_VARARGS,
     "linked_library(path, symbol) -> the file of the library providing `symbol` to the loaded object `path`, or None."},
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(api, data, out, scale_num, left, top, bgr, max_pixels): decode the JPEG `data` at scale\n"
     "scale_num/8 and write the region of out.shape[:2] at (left, top) of the scaled image into `out` (uint8\n"
     "H x W x 3, RGB or BGR). Releases the GIL. Raises ValueError on corrupt data, a region outside the image, or\n"
     "a header whose width x height is over max_pixels (checked before decoding)."},
    {"header", header, METH_VARARGS,
     "header(api, data, scale_num=8) -> (width, height, components) of the image decoded at scale_num/8."},
    {"restart_rewrite", fd_restart_rewrite, METH_VARARGS,
     "restart_rewrite(api, data, interval_mcus, optimize, max_pixels) -> (jpeg, offsets): rewrite the JPEG `data`\n"
     "losslessly (DCT coefficients copied) as a baseline Huffman JPEG with a restart marker every interval_mcus\n"
     "MCUs, APPn/COM markers kept; `offsets` (uint32 bytes) are where each restart segment starts, then where EOI\n"
     "is. Releases the GIL. NotImplementedError for a JPEG it does not rewrite (arithmetic coding, not 8-bit,\n"
     "CMYK/YCCK, lossless, damaged entropy data), ValueError for one libjpeg cannot read."},
    {"restart_scan", fd_restart_scan, METH_VARARGS,
     "restart_scan(data) -> offsets (uint32 bytes): where each restart segment of the JPEG's first scan starts,\n"
     "then where its entropy-coded data ends. ValueError when it has no scan. Releases the GIL."},
    {"restart_assemble", fd_restart_assemble, METH_VARARGS,
     "restart_assemble(data, offsets, columns, keep, tables, sof, c0, r0, c1, r1, width, height) -> bytes: the\n"
     "sub-JPEG of MCU columns [c0, c1) x rows [r0, r1) (see fastdata.image.jpeg.restart.assemble)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "fastdata._jpeg_region",
    "Region + DCT-scaled JPEG decoding through libjpeg-turbo (see fastdata.jpeg_region).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module_def); }
