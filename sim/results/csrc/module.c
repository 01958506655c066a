/* The extension module stepplan.sim.results._csv: a results table's CSV text written
 * (csv_lines, csv_text.c) and its number columns read back (read_columns, csv_read.c),
 * Python's code in sim/results/table.py being the specification of both. Built by pip
 * install (setup.py); csv_compiled.py checks SOURCE_DIGEST against the sources beside it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "csv.h"

#ifndef CSV_SOURCE_DIGEST
#define CSV_SOURCE_DIGEST ""
#endif

static PyMethodDef methods[] = {
    {"csv_lines", (PyCFunction)csv_text_lines, METH_O,
     "csv_lines(columns) -> str: each row's cells joined by ',' and ended by '\\n'. A column "
     "is a float64 array (repr; NaN empty), an int64 array (str) or a list of str (as is, "
     "quoting is the caller's); all of one length."},
    {"read_columns", csv_read_columns, METH_VARARGS,
     "read_columns(data, offset, num_fields, fields, kinds, columns, first_row, final)\n"
     "-> (rows, end) or None\n\n"
     "Parse the CSV lines of ``data`` (bytes, num_fields fields a line) from ``offset``\n"
     "into ``columns`` (writable int64/float64 buffers, one per field index of\n"
     "``fields``, of the kind 'i' or 'f' in ``kinds``) from row ``first_row`` on, until\n"
     "they are full or the whole lines end (a last line without its newline counts\n"
     "where ``final``): the row after the last read and the offset after its line, or\n"
     "None where a line is not plain."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "stepplan.sim.results._csv",
    "A results table's CSV text in C: its lines written and its number columns read "
    "(sim/results/table.py is the specification).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__csv(void) {
    csv_read_init();
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddStringConstant(module, "SOURCE_DIGEST", CSV_SOURCE_DIGEST) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
