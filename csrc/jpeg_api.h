/*
 * The libjpeg-turbo entry points fastdata._jpeg_region resolves at run time (see jpeg_region.c: load()), shared by
 * its source files: jpeg_region.c (region decoding) and jpeg_restart.c (lossless restart-marker rewrite).
 */
#ifndef FASTDATA_JPEG_API_H
#define FASTDATA_JPEG_API_H

#include <Python.h>

#include <stdio.h>

#include "jpeglib.h"

typedef struct jpeg_error_mgr *(*std_error_fn)(struct jpeg_error_mgr *);
typedef void (*create_fn)(j_decompress_ptr, int, size_t);
typedef void (*destroy_fn)(j_decompress_ptr);
typedef void (*mem_src_fn)(j_decompress_ptr, const unsigned char *, unsigned long);
typedef int (*read_header_fn)(j_decompress_ptr, boolean);
typedef boolean (*start_fn)(j_decompress_ptr);
typedef void (*crop_fn)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
typedef JDIMENSION (*skip_fn)(j_decompress_ptr, JDIMENSION);
typedef JDIMENSION (*read_fn)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);

/* The transcoding (lossless rewrite) entry points: decompress side, then compress side. */
typedef void (*save_markers_fn)(j_decompress_ptr, int, unsigned int);
typedef jvirt_barray_ptr *(*read_coefficients_fn)(j_decompress_ptr);
typedef void (*create_compress_fn)(j_compress_ptr, int, size_t);
typedef void (*destroy_compress_fn)(j_compress_ptr);
typedef void (*copy_critical_fn)(j_decompress_ptr, j_compress_ptr);
typedef void (*write_coefficients_fn)(j_compress_ptr, jvirt_barray_ptr *);
typedef void (*write_marker_fn)(j_compress_ptr, int, const JOCTET *, unsigned int);
typedef void (*finish_compress_fn)(j_compress_ptr);

typedef struct {
    void *handle;
    std_error_fn std_error;
    create_fn create;
    destroy_fn destroy;
    mem_src_fn mem_src;
    read_header_fn read_header;
    start_fn start;
    crop_fn crop;
    skip_fn skip;
    read_fn read;
    /* Optional: NULL where the library lacks one (then has_transcode is 0 and restart_rewrite refuses). */
    int has_transcode;
    save_markers_fn save_markers;
    read_coefficients_fn read_coefficients;
    create_compress_fn create_compress;
    destroy_compress_fn destroy_compress;
    copy_critical_fn copy_critical;
    write_coefficients_fn write_coefficients;
    write_marker_fn write_marker;
    finish_compress_fn finish_compress;
} jpeg_api;

#define CAPSULE_NAME "fastdata._jpeg_region.api"

static inline const jpeg_api *get_api(PyObject *capsule) {
    return (const jpeg_api *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);  /* sets TypeError if not one */
}

/* jpeg_restart.c */
PyObject *fd_restart_rewrite(PyObject *module, PyObject *args);
PyObject *fd_restart_scan(PyObject *module, PyObject *args);
PyObject *fd_restart_assemble(PyObject *module, PyObject *args);

#endif
