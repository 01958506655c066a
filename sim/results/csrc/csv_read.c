/* The number columns of a block of plain CSV lines in one call, the values
 * sim/results/table.py's Python reader gives (that Python code is the specification;
 * tests/test_csv_read.py holds the two equal). It takes only lines it is sure of --
 * ASCII, no quote, no carriage return, no blank line, every line as many fields as the
 * header, every cell of a column read a number of a plain form -- and refuses a block
 * with anything else, which the Python reader then reads (naming the line of a bad cell).
 * A float cell is converted by C's strtod in the "C" locale where the C library is glibc
 * (correctly rounded, as Python's float() is, and twice as fast), else and for inf and
 * nan by the very function float() calls (PyOS_string_to_double); an empty float cell is
 * NaN. Part of the module stepplan.sim.results._csv (module.c). */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l */
#endif
#include <Python.h>
#ifdef __GLIBC__
#include <locale.h>
#include <stdlib.h>
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "csv.h"

/* Longer float cells are left to Python (repr writes at most 24 characters). */
#define CELL_ROOM 64
/* Integers of more digits may not fit int64: left to Python, which says so. */
#define MAX_INT_DIGITS 18

enum { SKIP = -1 };
enum { REFUSED = -1, FAILED = -2 }; /* parse_lines' answers besides 0 */

typedef struct {
    char kind;         /* 'i': int64, 'f': float64 */
    Py_buffer view;    /* the output column, writable */
    Py_ssize_t count;  /* its items */
} Output;

/* The int64 of cell [start, end): [+-]digits; 0 with the value, -1 where not that form. */
static int parse_int(const char *start, const char *end, int64_t *value) {
    int negative = 0;
    if (start < end && (*start == '-' || *start == '+')) {
        negative = *start == '-';
        start++;
    }
    Py_ssize_t digits = end - start;
    if (digits < 1 || digits > MAX_INT_DIGITS) {
        return -1;
    }
    int64_t total = 0;
    for (; start < end; start++) {
        if (*start < '0' || *start > '9') {
            return -1;
        }
        total = total * 10 + (*start - '0');
    }
    *value = negative ? -total : total;
    return 0;
}

#ifdef __GLIBC__
/* The "C" locale, made once when the module loads: strtod_l's decimal point is '.'
 * whatever the process's locale. */
static locale_t c_locale = (locale_t)0;
#endif

enum { NOT_FLOAT, DECIMAL, INF_OR_NAN };

/* Whether [start, end) is [+-](digits[.digits]|.digits)[(e|E)[+-]digits] (DECIMAL), or
 * [+-]inf / [+-]nan as repr writes them (INF_OR_NAN); NOT_FLOAT otherwise. */
static int float_form(const char *start, const char *end) {
    if (start < end && (*start == '-' || *start == '+')) {
        start++;
    }
    Py_ssize_t left = end - start;
    if (left == 3 && (memcmp(start, "inf", 3) == 0 || memcmp(start, "nan", 3) == 0)) {
        return INF_OR_NAN;
    }
    int mantissa = 0;
    for (; start < end && *start >= '0' && *start <= '9'; start++) {
        mantissa++;
    }
    if (start < end && *start == '.') {
        for (start++; start < end && *start >= '0' && *start <= '9'; start++) {
            mantissa++;
        }
    }
    if (mantissa == 0) {
        return NOT_FLOAT;
    }
    if (start < end && (*start == 'e' || *start == 'E')) {
        start++;
        if (start < end && (*start == '-' || *start == '+')) {
            start++;
        }
        int exponent = 0;
        for (; start < end && *start >= '0' && *start <= '9'; start++) {
            exponent++;
        }
        if (exponent == 0) {
            return NOT_FLOAT;
        }
    }
    return start == end ? DECIMAL : NOT_FLOAT;
}

/* The float64 of cell [start, end) (empty: NaN); 0 with the value, -1 where the cell is not
 * a plain number. */
static int parse_float(const char *start, const char *end, double *value) {
    Py_ssize_t length = end - start;
    if (length == 0) {
        *value = Py_NAN;
        return 0;
    }
    int form = length < CELL_ROOM ? float_form(start, end) : NOT_FLOAT;
    if (form == NOT_FLOAT) {
        return -1;
    }
    char cell[CELL_ROOM];
    memcpy(cell, start, (size_t)length);
    cell[length] = '\0';
    char *stop = NULL;
#ifdef __GLIBC__
    if (form == DECIMAL && c_locale != (locale_t)0) {
        *value = strtod_l(cell, &stop, c_locale);
        return stop == cell + length ? 0 : -1;
    }
#endif
    double parsed = PyOS_string_to_double(cell, &stop, NULL);
    if (parsed == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (stop != cell + length) {
        return -1;
    }
    *value = parsed;
    return 0;
}

/* Parse whole lines of [at, stop) into the outputs from row ``row`` on (slot[f]: the output
 * of field f, or SKIP), until the outputs are full or the lines end; a last line without
 * its '\n' counts only where ``final`` (the file's end). *rows: the row after the last
 * read, *end: where its line ends; 0, or REFUSED where a line is not what this reader
 * takes. */
static int parse_lines(const char *at, const char *stop, int final, Py_ssize_t num_fields,
                       const Py_ssize_t *slot, Output *outputs, Py_ssize_t room,
                       Py_ssize_t *rows, const char **end) {
    Py_ssize_t row = *rows;
    while (at < stop && row < room) {
        const char *line_end = memchr(at, '\n', (size_t)(stop - at));
        if (line_end == NULL) {
            if (!final) {
                break; /* the rest of the line comes with the next block */
            }
            line_end = stop;
        }
        if (line_end == at) {
            return REFUSED; /* a blank line */
        }
        for (Py_ssize_t field = 0; field < num_fields; field++) {
            const char *cell = at;
            while (at < line_end && *at != ',') {
                unsigned char c = (unsigned char)*at;
                if (c == '"' || c == '\r' || c == 0 || c >= 0x80) {
                    return REFUSED;
                }
                at++;
            }
            if ((field == num_fields - 1) != (at == line_end)) {
                return REFUSED; /* more or fewer fields than the header */
            }
            Py_ssize_t index = slot[field];
            if (index != SKIP) {
                Output *out = &outputs[index];
                int bad = out->kind == 'i'
                              ? parse_int(cell, at, (int64_t *)out->view.buf + row)
                              : parse_float(cell, at, (double *)out->view.buf + row);
                if (bad) {
                    return REFUSED;
                }
            }
            at++; /* past the comma or the line's end */
        }
        row++;
        at = line_end < stop ? line_end + 1 : stop;
    }
    *rows = row;
    *end = at;
    return 0;
}

PyObject *csv_read_columns(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data;
    Py_ssize_t offset, num_fields, first_row;
    int final;
    PyObject *fields, *kinds, *columns;
    if (!PyArg_ParseTuple(args, "y*nnO!UO!np:read_columns", &data, &offset, &num_fields,
                          &PyTuple_Type, &fields, &kinds, &PyTuple_Type, &columns,
                          &first_row, &final)) {
        return NULL;
    }
    Py_ssize_t wanted = PyTuple_GET_SIZE(fields);
    Py_ssize_t *slot = NULL;
    Output *outputs = NULL;
    Py_ssize_t bound = 0;
    int status = FAILED;
    Py_ssize_t rows = first_row;
    const char *end = NULL;
    if (num_fields < 1 || PyUnicode_GET_LENGTH(kinds) != wanted ||
        PyTuple_GET_SIZE(columns) != wanted || offset < 0 || offset > data.len ||
        first_row < 0) {
        PyErr_SetString(PyExc_ValueError, "read_columns: fields, kinds and columns differ in "
                                          "length, or the offset or first row is out of range");
        goto done;
    }
    slot = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)num_fields);
    outputs = PyMem_Calloc((size_t)(wanted ? wanted : 1), sizeof(Output));
    if (slot == NULL || outputs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t f = 0; f < num_fields; f++) {
        slot[f] = SKIP;
    }
    Py_ssize_t room = PY_SSIZE_T_MAX;
    for (; bound < wanted; bound++) {
        Output *out = &outputs[bound];
        Py_ssize_t field = PyLong_AsSsize_t(PyTuple_GET_ITEM(fields, bound));
        if (field == -1 && PyErr_Occurred()) {
            goto done;
        }
        out->kind = (char)PyUnicode_READ_CHAR(kinds, bound);
        if (field < 0 || field >= num_fields || slot[field] != SKIP ||
            (out->kind != 'i' && out->kind != 'f')) {
            PyErr_SetString(PyExc_ValueError, "read_columns: a field out of range, twice, "
                                              "or of a kind other than 'i' and 'f'");
            goto done;
        }
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, bound), &out->view, flags) < 0) {
            goto done;
        }
        const char *format = out->view.format ? out->view.format : "B";
        format += (*format == '=' || *format == '@' || *format == '<');
        int fits = out->kind == 'i' ? (*format == 'q' || *format == 'l') : *format == 'd';
        if (out->view.itemsize != 8 || !fits || format[1] != '\0') {
            PyBuffer_Release(&out->view);
            PyErr_SetString(PyExc_ValueError,
                            "read_columns: a column of kind 'i' must be int64, of 'f' float64");
            goto done;
        }
        out->count = out->view.len / 8;
        room = out->count < room ? out->count : room;
        slot[field] = bound;
    }
    const char *base = data.buf;
    status = parse_lines(base + offset, base + data.len, final, num_fields, slot, outputs,
                         room, &rows, &end);
    if (status == 0) {
        offset = end - base;
    }
done:
    for (Py_ssize_t i = 0; i < bound; i++) {
        PyBuffer_Release(&outputs[i].view);
    }
    PyMem_Free(slot);
    PyMem_Free(outputs);
    PyBuffer_Release(&data);
    if (status == FAILED) {
        return NULL;
    }
    if (status == REFUSED) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(nn)", rows, offset);
}

void csv_read_init(void) {
#ifdef __GLIBC__
    if (c_locale == (locale_t)0) {
        c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); /* none: Python's parser */
    }
#endif
}
