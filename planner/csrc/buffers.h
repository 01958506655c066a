/* Typed, checked views of the Python buffers the packer and the batch check take: each
 * refusal raises TypeError or ValueError naming the argument. */
#ifndef STEPPLAN_BUFFERS_H
#define STEPPLAN_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A C-contiguous buffer of ``itemsize``-byte items of struct code ``code`` ('i' int32,
 * 'b' int8), writable if asked; 0, or -1 with an exception set (nothing held). */
int get_array(PyObject *obj, Py_buffer *view, const char *name, char code,
              Py_ssize_t itemsize, int writable);

/* An array of int32 items at any strides, read-only; as get_array. */
int get_strided(PyObject *obj, Py_buffer *view, const char *name);

/* A non-negative C integer from argument ``name``; -1 with an exception set otherwise. */
Py_ssize_t get_count(PyObject *obj, const char *name);

/* ``obj`` itself (a new reference) or, for an ``(address, items)`` tuple, a read-only 1-D
 * int32 memoryview of ``items`` values at that host address (the caller vouches for the
 * memory: a torch CPU tensor's ``data_ptr()``, say, viewed without ``numpy()``'s cost).
 * NULL with an exception set for a tuple that is not two non-negative ints. */
PyObject *address_or_object(PyObject *obj);

/* Whether two buffers share a byte, whatever their strides. */
int shares_memory(const Py_buffer *a, const Py_buffer *b);

#endif
