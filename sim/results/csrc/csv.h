/* The functions of the module stepplan.sim.results._csv, the CSV text of results tables:
 * the formatter (csv_text.c) and the number reader (csv_read.c); module.c binds them. */
#ifndef STEPPLAN_CSV_H
#define STEPPLAN_CSV_H

#include <Python.h>

/* csv_lines(columns) -> str (csv_text.c). */
PyObject *csv_text_lines(PyObject *module, PyObject *arg);

/* read_columns(data, offset, num_fields, fields, kinds, columns, first_row, final)
 * -> (rows, end) or None (csv_read.c). */
PyObject *csv_read_columns(PyObject *module, PyObject *args);

/* What the reader needs once before its first call: the "C" locale of strtod_l. */
void csv_read_init(void);

#endif
