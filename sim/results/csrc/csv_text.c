/* A results table's CSV lines from its columns in one call, the bytes
 * sim/results/table.py's csv_lines(csv_cells(...)) writes (that Python code is the
 * specification; tests/test_csv_text.py holds the two equal). A float cell is Python's
 * repr, made by the very function repr calls (PyOS_double_to_string, mode 'r'); NaN is an
 * empty cell. Part of the module stepplan.sim.results._csv (module.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "csv.h"

/* The longest float repr is 24 characters ("-2.2250738585072014e-308"). */
#define REPR_ROOM 32
/* Float reprs kept per call, by bit pattern: step tables repeat many values (cost terms
 * of repeated shapes, zeros, KV usage), and a repr costs far more than a lookup. */
#define CACHE_SLOTS 4096

typedef struct {
    uint64_t bits;
    unsigned char len; /* 0: empty slot (no repr is empty) */
    char text[REPR_ROOM - 1];
} ReprSlot;

enum { FLOATS, INTS, CELLS };

typedef struct {
    int kind;
    Py_buffer view;      /* FLOATS, INTS */
    PyObject *cells;     /* CELLS: a list of str */
} Column;

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t room;
} Text;

/* Room for ``more`` bytes past the text's end; -1 with MemoryError. */
static int reserve(Text *text, Py_ssize_t more) {
    if (text->size + more <= text->room) {
        return 0;
    }
    Py_ssize_t room = text->room * 2 > text->size + more ? text->room * 2 : text->size + more;
    char *data = PyMem_Realloc(text->data, (size_t)room);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    text->data = data;
    text->room = room;
    return 0;
}

/* str(value) of an int64, written at ``out``; its length. */
static int put_int(char *out, int64_t value) {
    char digits[24];
    int count = 0;
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    do {
        digits[count++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    int length = 0;
    if (value < 0) {
        out[length++] = '-';
    }
    while (count) {
        out[length++] = digits[--count];
    }
    return length;
}

/* repr(value) at ``out`` (NaN: nothing), through ``cache``; its length, -1 on error. */
static int put_float(char *out, double value, ReprSlot *cache) {
    if (value != value) {
        return 0;
    }
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    ReprSlot *slot = &cache[(bits * UINT64_C(0x9E3779B97F4A7C15)) >> 52];
    if (slot->len == 0 || slot->bits != bits) {
        char *made = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (made == NULL) {
            return -1;
        }
        size_t length = strlen(made);
        if (length >= sizeof slot->text) { /* cannot happen for a double; kept safe */
            PyMem_Free(made);
            PyErr_SetString(PyExc_ValueError, "csv_text: a float repr too long");
            return -1;
        }
        memcpy(slot->text, made, length);
        PyMem_Free(made);
        slot->bits = bits;
        slot->len = (unsigned char)length;
    }
    memcpy(out, slot->text, slot->len);
    return slot->len;
}

/* The column ``obj`` as a Column; its row count in *rows; -1 with an exception. */
static int bind_column(PyObject *obj, Column *column, Py_ssize_t *rows) {
    if (PyList_Check(obj)) {
        column->kind = CELLS;
        column->cells = obj;
        *rows = PyList_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &column->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = column->view.format ? column->view.format : "B";
    if (*format == '=' || *format == '@' || *format == '<') {
        format++;
    }
    int ok = column->view.itemsize == 8 && format[1] == '\0' && column->view.ndim == 1;
    if (ok && format[0] == 'd') {
        column->kind = FLOATS;
    } else if (ok && (format[0] == 'l' || format[0] == 'q')) {
        column->kind = INTS;
    } else {
        PyErr_Format(PyExc_TypeError, "csv_text: a column of format '%s' (float64, int64 or "
                     "a list of str)", column->view.format);
        PyBuffer_Release(&column->view);
        return -1;
    }
    *rows = column->view.len / 8;
    return 0;
}

static void release(Column *columns, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        if (columns[i].kind != CELLS) {
            PyBuffer_Release(&columns[i].view);
        }
    }
}

/* Append row ``row`` (its cells and a line end) to ``text``; -1 with an exception. */
static int put_row(Text *text, Column *columns, Py_ssize_t count, Py_ssize_t row,
                   ReprSlot *cache) {
    for (Py_ssize_t i = 0; i < count; i++) {
        Column *column = &columns[i];
        if (column->kind == CELLS) {
            PyObject *cell = PyList_GET_ITEM(column->cells, row);
            Py_ssize_t length;
            const char *utf8 = PyUnicode_Check(cell) ? PyUnicode_AsUTF8AndSize(cell, &length)
                                                     : NULL;
            if (utf8 == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "csv_text: a text cell is not a str");
                }
                return -1;
            }
            if (reserve(text, length + 1) < 0) {
                return -1;
            }
            memcpy(text->data + text->size, utf8, (size_t)length);
            text->size += length;
        } else {
            if (reserve(text, REPR_ROOM + 1) < 0) {
                return -1;
            }
            char *out = text->data + text->size;
            int length = column->kind == INTS
                             ? put_int(out, ((const int64_t *)column->view.buf)[row])
                             : put_float(out, ((const double *)column->view.buf)[row], cache);
            if (length < 0) {
                return -1;
            }
            text->size += length;
        }
        text->data[text->size++] = i + 1 < count ? ',' : '\n';
    }
    return 0;
}

PyObject *csv_text_lines(PyObject *Py_UNUSED(module), PyObject *arg) {
    PyObject *sequence = PySequence_Fast(arg, "csv_lines: takes a sequence of columns");
    if (sequence == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    Column *columns = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Column));
    ReprSlot *cache = PyMem_Calloc(CACHE_SLOTS, sizeof(ReprSlot));
    Text text = {NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t bound = 0, rows = 0;
    if (columns == NULL || cache == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; bound < count; bound++) {
        Py_ssize_t length;
        if (bind_column(PySequence_Fast_GET_ITEM(sequence, bound), &columns[bound], &length) <
            0) {
            goto done;
        }
        if (bound == 0) {
            rows = length;
        } else if (length != rows) {
            bound++;
            PyErr_SetString(PyExc_ValueError, "csv_lines: columns of different lengths");
            goto done;
        }
    }
    if (count == 0) {
        rows = 0;
    }
    if (reserve(&text, rows * (count * 12 + 1) + 1) < 0) {
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        if (put_row(&text, columns, count, row, cache) < 0) {
            goto done;
        }
    }
    result = PyUnicode_DecodeUTF8(text.data, text.size, "strict");
done:
    release(columns, bound);
    PyMem_Free(columns);
    PyMem_Free(cache);
    PyMem_Free(text.data);
    Py_DECREF(sequence);
    return result;
}
