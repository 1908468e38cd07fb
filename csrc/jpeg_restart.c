/*
 * fastdata._jpeg_region, part 2: the lossless restart-marker rewrite (what `jpegtran -restart 1B` does), through the
 * libjpeg-turbo the capsule of jpeg_region.c's load() resolved, and the scan for restart segments.
 *
 * A JPEG rewritten with a restart marker after every MCU is a set of independently decodable pieces: the entropy
 * coder's state (DC predictions, bit buffer) is reset at each marker, so the pieces a crop covers, behind a header
 * with the crop's size, form a valid JPEG of the crop (fastdata/image/jpeg/restart.py assembles it). The DCT
 * coefficients are copied, never re-quantised: the rewrite decodes to exactly the original's pixels.
 *
 * Refused (NotImplementedError, so a converter can keep the original bytes and count it): arithmetic coding, a
 * sample precision other than 8 bits, lossless JPEG, CMYK/YCCK or any colour space but grayscale, YCbCr and RGB,
 * fractional sampling factors, and entropy data libjpeg had to recover from (damaged: the original's pixels then
 * depend on the decoder's recovery). A header that says more pixels than the limit, or bytes libjpeg cannot read,
 * raise ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include "jpeg_api.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jerror.h"

#define M_SOS 0xDA
#define M_EOI 0xD9

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
    int damaged;  /* a warning that the entropy data is corrupt was emitted (message holds the first) */
} rewrite_error_mgr;

static void rewrite_error_exit(j_common_ptr cinfo) {
    rewrite_error_mgr *err = (rewrite_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

/* A truncated file is an error (as for the decoders); warnings of damaged entropy data are recorded (the rewrite is
 * then refused); others (extraneous bytes before a marker, an unknown JFIF revision) are harmless. */
static void rewrite_emit_message(j_common_ptr cinfo, int msg_level) {
    rewrite_error_mgr *err = (rewrite_error_mgr *)cinfo->err;
    if (msg_level >= 0) return;
    int code = cinfo->err->msg_code;
    if (code == JWRN_JPEG_EOF) rewrite_error_exit(cinfo);
    if (code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE || code == JWRN_MUST_RESYNC ||
        code == JWRN_NOT_SEQUENTIAL || code == JWRN_BOGUS_PROGRESSION || code == JWRN_ARITH_BAD_CODE) {
        if (!err->damaged) (*cinfo->err->format_message)(cinfo, err->message);
        err->damaged = 1;
    }
    cinfo->err->num_warnings++;
}

static void rewrite_output_message(j_common_ptr cinfo) { (void)cinfo; }

/* A destination manager writing into one growing malloc'd buffer that the caller owns (and frees, also after an
 * error): libjpeg's jpeg_mem_dest would leave its buffer to a library-side free on error paths. */
typedef struct {
    struct jpeg_destination_mgr pub;
    unsigned char *buffer;
    size_t capacity;
    size_t used;
} grow_dest;

static void dest_init(j_compress_ptr cinfo) {
    grow_dest *dest = (grow_dest *)cinfo->dest;
    dest->pub.next_output_byte = dest->buffer;
    dest->pub.free_in_buffer = dest->capacity;
}

static boolean dest_empty(j_compress_ptr cinfo) {  /* called when the whole buffer is full */
    grow_dest *dest = (grow_dest *)cinfo->dest;
    size_t grown = dest->capacity * 2;
    unsigned char *buffer = realloc(dest->buffer, grown);
    if (buffer == NULL) {
        cinfo->err->msg_code = JERR_OUT_OF_MEMORY;
        cinfo->err->msg_parm.i[0] = 0;
        (*cinfo->err->error_exit)((j_common_ptr)cinfo);
    }
    dest->buffer = buffer;
    dest->pub.next_output_byte = buffer + dest->capacity;
    dest->pub.free_in_buffer = grown - dest->capacity;
    dest->capacity = grown;
    return TRUE;
}

static void dest_term(j_compress_ptr cinfo) {
    grow_dest *dest = (grow_dest *)cinfo->dest;
    dest->used = dest->capacity - dest->pub.free_in_buffer;
}

/* The SOF marker (0xC0..0xCF) of the JPEG `data`, or -1 if there is none before the scan. Walks the marker
 * segments as libjpeg does (fill bytes and stray bytes between segments are passed over). */
static int frame_marker(const unsigned char *data, size_t size) {
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return -1;
    size_t pos = 2;
    while (pos + 4 <= size) {
        int marker = data[pos + 1];
        if (data[pos] != 0xFF || marker == 0xFF) {
            pos++;
            continue;
        }
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  /* TEM, RSTn, SOI: no length */
            pos += 2;
            continue;
        }
        if (marker == M_SOS || marker == M_EOI) return -1;
        if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) return marker;
        pos += 2 + (((size_t)data[pos + 2] << 8) | data[pos + 3]);
    }
    return -1;
}

/* Where each restart segment of the first scan of `data` starts, then 2 past the start of the marker that ends the
 * scan (EOI in a rewritten JPEG), so that segment i is data[offsets[i] : offsets[i + 1] - 2] in every case.
 * In entropy-coded data a 0xFF byte is followed by 0x00 (a stuffed 0xFF), 0xFF (fill) or a marker, so the scan is
 * exact. Returns the number of offsets (segments + 1), 0 if there is no scan, -1 out of memory (*out malloc'd). */
static Py_ssize_t scan_segments(const unsigned char *data, size_t size, uint32_t **out) {
    *out = NULL;
    if (size < 4 || size > UINT32_MAX || data[0] != 0xFF || data[1] != 0xD8) return 0;
    size_t pos = 2;
    for (;;) {  /* to the end of the first SOS segment */
        if (pos + 4 > size) return 0;
        int marker = data[pos + 1];
        if (data[pos] != 0xFF || marker == 0xFF) {
            pos++;
            continue;
        }
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {
            pos += 2;
            continue;
        }
        if (marker == M_EOI) return 0;
        pos += 2 + (((size_t)data[pos + 2] << 8) | data[pos + 3]);
        if (marker == M_SOS) break;
    }
    if (pos > size) return 0;
    size_t capacity = 256, count = 0;
    uint32_t *offsets = malloc(capacity * sizeof(uint32_t));
    if (offsets == NULL) return -1;
    offsets[count++] = (uint32_t)pos;
    size_t end = size;  /* without an end marker: the data's end */
    while (pos + 1 < size) {
        const unsigned char *ff = memchr(data + pos, 0xFF, size - 1 - pos);
        if (ff == NULL) break;
        pos = (size_t)(ff - data);
        int next = data[pos + 1];
        if (next == 0x00) {
            pos += 2;
            continue;
        }
        if (next == 0xFF) {
            pos += 1;
            continue;
        }
        if (next >= 0xD0 && next <= 0xD7) {
            if (count + 2 > capacity) {
                capacity *= 2;
                uint32_t *grown = realloc(offsets, capacity * sizeof(uint32_t));
                if (grown == NULL) {
                    free(offsets);
                    return -1;
                }
                offsets = grown;
            }
            offsets[count++] = (uint32_t)(pos + 2);
            pos += 2;
            continue;
        }
        end = pos + 2;
        break;
    }
    offsets[count++] = (uint32_t)end;
    *out = offsets;
    return (Py_ssize_t)count;
}

enum { REWRITE_OK = 0, REWRITE_BAD = -1, REWRITE_UNSUPPORTED = -2 };

/* The rewrite proper, without the GIL. On success dest->buffer holds dest->used bytes (the caller frees it). */
static int rewrite(const jpeg_api *api, const unsigned char *data, size_t size, unsigned int interval,
                   int optimize, long long max_pixels, grow_dest *dest, char *message) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    rewrite_error_mgr err;
    volatile int dst_created = 0;

    int sof = frame_marker(data, size);
    if (sof >= 0 && sof != 0xC0 && sof != 0xC1 && sof != 0xC2) {
        snprintf(message, JMSG_LENGTH_MAX, "unsupported JPEG coding process (SOF marker 0x%02X: %s)", sof,
                 sof >= 0xC9 ? "arithmetic coding" : (sof & 3) == 3 ? "lossless" : "hierarchical");
        return REWRITE_UNSUPPORTED;
    }
    memset(&src, 0, sizeof(src));
    memset(&dst, 0, sizeof(dst));
    src.err = api->std_error(&err.pub);
    err.pub.error_exit = rewrite_error_exit;
    err.pub.output_message = rewrite_output_message;
    err.pub.emit_message = rewrite_emit_message;
    err.message[0] = '\0';
    err.damaged = 0;
    dst.err = &err.pub;
    if (setjmp(err.escape)) {
        snprintf(message, JMSG_LENGTH_MAX, "libjpeg-turbo: %s", err.message);
        if (dst_created) api->destroy_compress(&dst);
        api->destroy(&src);
        return REWRITE_BAD;
    }
    api->create(&src, JPEG_LIB_VERSION, sizeof(struct jpeg_decompress_struct));
    api->save_markers(&src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++) api->save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    api->mem_src(&src, data, (unsigned long)size);
    api->read_header(&src, TRUE);
    if ((long long)src.image_width * (long long)src.image_height > max_pixels) {
        snprintf(message, JMSG_LENGTH_MAX, "refused: the JPEG header says %ux%u pixels, over the limit of %lld",
                 src.image_width, src.image_height, max_pixels);
        api->destroy(&src);
        return REWRITE_BAD;
    }
    const char *unsupported = NULL;
    if (src.arith_code) unsupported = "arithmetic coding";
    else if (src.data_precision != 8) unsupported = "a sample precision other than 8 bits";
    else if (src.num_components == 3 && src.jpeg_color_space != JCS_YCbCr && src.jpeg_color_space != JCS_RGB)
        unsupported = "a 3-component colour space other than YCbCr and RGB";
    else if (src.num_components == 1 && src.jpeg_color_space != JCS_GRAYSCALE)
        unsupported = "a 1-component colour space other than grayscale";
    else if (src.num_components != 1 && src.num_components != 3) unsupported = "not 1 or 3 components (CMYK/YCCK?)";
    for (int c = 0; unsupported == NULL && c < src.num_components; c++) {
        jpeg_component_info *comp = &src.comp_info[c];
        if (src.max_h_samp_factor % comp->h_samp_factor || src.max_v_samp_factor % comp->v_samp_factor)
            unsupported = "fractional chroma sampling factors";
    }
    if (unsupported != NULL) {
        snprintf(message, JMSG_LENGTH_MAX, "unsupported JPEG: %s (%d components, %d-bit)", unsupported,
                 src.num_components, src.data_precision);
        api->destroy(&src);
        return REWRITE_UNSUPPORTED;
    }
    jvirt_barray_ptr *coefficients = api->read_coefficients(&src);
    if (err.damaged) {
        snprintf(message, JMSG_LENGTH_MAX, "unsupported JPEG: damaged entropy data (libjpeg-turbo: %s)", err.message);
        api->destroy(&src);
        return REWRITE_UNSUPPORTED;
    }
    api->create_compress(&dst, JPEG_LIB_VERSION, sizeof(struct jpeg_compress_struct));
    dst_created = 1;
    api->copy_critical(&src, &dst);  /* sampling, quantisation tables, colour space, JFIF density; baseline */
    dst.optimize_coding = optimize ? TRUE : FALSE;
    dst.restart_interval = interval;
    dst.restart_in_rows = 0;
    dest->pub.init_destination = dest_init;
    dest->pub.empty_output_buffer = dest_empty;
    dest->pub.term_destination = dest_term;
    dst.dest = &dest->pub;
    api->write_coefficients(&dst, coefficients);
    /* APPn and COM as jpegtran copies them: not a second JFIF APP0 or Adobe APP14 where libjpeg writes its own */
    for (jpeg_saved_marker_ptr marker = src.marker_list; marker != NULL; marker = marker->next) {
        const JOCTET *d = marker->data;
        if (dst.write_JFIF_header && marker->marker == JPEG_APP0 && marker->data_length >= 5 && d[0] == 'J' &&
            d[1] == 'F' && d[2] == 'I' && d[3] == 'F' && d[4] == 0)
            continue;
        if (dst.write_Adobe_marker && marker->marker == JPEG_APP0 + 14 && marker->data_length >= 5 &&
            d[0] == 'A' && d[1] == 'd' && d[2] == 'o' && d[3] == 'b' && d[4] == 'e')
            continue;
        api->write_marker(&dst, marker->marker, marker->data, marker->data_length);
    }
    api->finish_compress(&dst);
    api->destroy_compress(&dst);
    api->destroy(&src);
    return REWRITE_OK;
}

PyObject *fd_restart_rewrite(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *capsule;
    Py_buffer src;
    int interval = 1, optimize = 1;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, "Oy*ipL", &capsule, &src, &interval, &optimize, &max_pixels)) return NULL;
    PyObject *result = NULL;
    grow_dest dest;
    memset(&dest, 0, sizeof(dest));
    uint32_t *offsets = NULL;
    const jpeg_api *api = get_api(capsule);
    if (api == NULL) goto done;
    if (!api->has_transcode) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "this libjpeg lacks the transcoding entry points (jpeg_read_coefficients, ...)");
        goto done;
    }
    if (interval < 0 || interval > 65535) {  /* 0: no restart markers (to measure what they cost) */
        PyErr_Format(PyExc_ValueError, "interval_mcus must be 0..65535, got %d", interval);
        goto done;
    }
    dest.capacity = (size_t)src.len + (size_t)src.len / 4 + 4096;
    dest.buffer = malloc(dest.capacity);
    if (dest.buffer == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    char message[JMSG_LENGTH_MAX];
    int status;
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS
    status = rewrite(api, (const unsigned char *)src.buf, (size_t)src.len, (unsigned int)interval, optimize,
                     max_pixels, &dest, message);
    if (status == REWRITE_OK) count = scan_segments(dest.buffer, dest.used, &offsets);
    Py_END_ALLOW_THREADS
    if (status != REWRITE_OK) {
        PyErr_SetString(status == REWRITE_UNSUPPORTED ? PyExc_NotImplementedError : PyExc_ValueError, message);
        goto done;
    }
    if (count < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (count < 2) {
        PyErr_SetString(PyExc_RuntimeError, "the rewritten JPEG has no scan (a libjpeg-turbo bug?)");
        goto done;
    }
    result = Py_BuildValue("(y#y#)", (const char *)dest.buffer, (Py_ssize_t)dest.used, (const char *)offsets,
                           count * (Py_ssize_t)sizeof(uint32_t));
done:
    free(dest.buffer);
    free(offsets);
    PyBuffer_Release(&src);
    return result;
}

PyObject *fd_restart_scan(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    uint32_t *offsets = NULL;
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = scan_segments((const unsigned char *)src.buf, (size_t)src.len, &offsets);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (count < 0) PyErr_NoMemory();
    else if (count == 0) PyErr_SetString(PyExc_ValueError, "not a JPEG with a scan (no SOS marker)");
    else result = PyBytes_FromStringAndSize((const char *)offsets, count * (Py_ssize_t)sizeof(uint32_t));
    free(offsets);
    PyBuffer_Release(&src);
    return result;
}

/* The sub-JPEG of the MCU columns [c0, c1) x rows [r0, r1) of a JPEG with a restart marker after every MCU:
 * data[:keep] + data[tables:offsets[0]] (SOF at `sof` in it patched to width x height), each row's pieces (one copy:
 * they are contiguous in the file), restart markers renumbered RST0..7 in turn, EOI. Every offset used is checked
 * against the data (a stored index may not match its JPEG): ValueError, never a read outside it. */
PyObject *fd_restart_assemble(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer src, index;
    Py_ssize_t columns, keep, tables, sof, c0, r0, c1, r1;
    unsigned int width, height;
    if (!PyArg_ParseTuple(args, "y*y*nnnnnnnnII", &src, &index, &columns, &keep, &tables, &sof, &c0, &r0, &c1, &r1,
                          &width, &height))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *data = (const unsigned char *)src.buf;
    const uint32_t *offsets = (const uint32_t *)index.buf;
    Py_ssize_t count = index.len / (Py_ssize_t)sizeof(uint32_t), size = src.len;
    const char *problem = NULL;
    if (columns < 1 || c0 < 0 || c1 <= c0 || c1 > columns || r0 < 0 || r1 <= r0 || r1 * columns + 1 > count)
        problem = "MCU range outside the index";
    else if (keep < 0 || keep > tables || tables > (Py_ssize_t)offsets[0] || (Py_ssize_t)offsets[0] > size ||
             sof < 0 || sof + 9 > keep + (Py_ssize_t)offsets[0] - tables)
        problem = "header positions outside the JPEG";
    Py_ssize_t head = keep + (Py_ssize_t)offsets[0] - tables, total = head + 2;
    for (Py_ssize_t r = r0; problem == NULL && r < r1; r++) {
        for (Py_ssize_t i = r * columns + c0; i < r * columns + c1; i++) {
            if ((Py_ssize_t)offsets[i + 1] > size || (Py_ssize_t)offsets[i + 1] < (Py_ssize_t)offsets[i] + 2 ||
                data[offsets[i + 1] - 2] != 0xFF) {
                problem = "the restart index does not match the JPEG";
                break;
            }
        }
        total += (Py_ssize_t)offsets[r * columns + c1] - (Py_ssize_t)offsets[r * columns + c0];
    }
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, total - 2);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    memcpy(out, data, (size_t)keep);
    memcpy(out + keep, data + tables, (size_t)(offsets[0] - (uint32_t)tables));
    out[sof + 5] = (unsigned char)(height >> 8);
    out[sof + 6] = (unsigned char)height;
    out[sof + 7] = (unsigned char)(width >> 8);
    out[sof + 8] = (unsigned char)width;
    Py_ssize_t at = head;
    unsigned int piece = 0;
    for (Py_ssize_t r = r0; r < r1; r++) {
        uint32_t start = offsets[r * columns + c0], end = offsets[r * columns + c1];
        memcpy(out + at, data + start, end - start);
        for (Py_ssize_t i = r * columns + c0; i < r * columns + c1; i++)
            out[at + (Py_ssize_t)(offsets[i + 1] - start) - 1] = (unsigned char)(0xD0 + (piece++ & 7));
        at += end - start;
    }
    out[at - 1] = M_EOI;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&index);
    return result;
}
