/* The extension module stepplan.planner._packer: the plan packer (pack.c, rows.c), a host
 * step's key (host.c) and StepBatch's compiled check (check.c). Built by pip install
 * (setup.py); loaded by planner/native.py, which checks SOURCE_DIGEST against the sources
 * beside it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "check.h"
#include "host.h"
#include "pack.h"
#include "rows.h"

/* setup.py passes the digest of the sources built from; a build by hand has none. */
#ifndef PACKER_SOURCE_DIGEST
#define PACKER_SOURCE_DIGEST ""
#endif

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL, PACK_DOC},
    {"prefill_tiles", (PyCFunction)(void (*)(void))prefill_tiles, METH_FASTCALL,
     "prefill_tiles(query_lens, kinds, tile) -> int: work tiles of the prefill rows."},
    {"check_batch", (PyCFunction)(void (*)(void))check_batch, METH_FASTCALL, CHECK_DOC},
    {"shape_counts", (PyCFunction)(void (*)(void))shape_counts, METH_FASTCALL,
     SHAPE_COUNTS_DOC},
    {"pack_host", (PyCFunction)(void (*)(void))pack_host, METH_FASTCALL, PACK_HOST_DOC},
    {"pack_host_eager", (PyCFunction)(void (*)(void))pack_host_eager, METH_FASTCALL,
     PACK_HOST_EAGER_DOC},
    {"host_bytes", (PyCFunction)(void (*)(void))host_bytes, METH_FASTCALL, HOST_BYTES_DOC},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "stepplan.planner._packer",
    "The compiled plan packer (see compile.py's _pack) and StepBatch's compiled check.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__packer(void) {
    if (PyType_Ready(&BoundRowsType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&BoundRowsType);
    if (PyModule_AddStringConstant(m, "SOURCE_DIGEST", PACKER_SOURCE_DIGEST) < 0 ||
        PyModule_AddObject(m, "BoundRows", (PyObject *)&BoundRowsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
