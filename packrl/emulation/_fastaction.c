/* The C half of the action decode: policy actions -> native actions, checked, for every action kind.

The policy hands an action layout (packrl/emulation/actions.py) a flat discrete part (int64
choices counted from 0) and a flat continuous part (float32 or float64). Here each is checked
(every choice in [0, n), every value in [low, high] and not NaN) and turned into the native
action: each leaf in its own dtype (``start`` added back), built into the space's Dicts and
Tuples.

    decode(spec, action)        -> the native action, or None
    decode_rows(spec, disc, cont) -> [native action per row], k (the first bad row) or None
    check_rows(spec, disc, cont)  -> -1 (every row inside the space), k (the first bad row) or None

None means "not taken" (another dtype, a non-contiguous array, a torch tensor, a bad choice in
``decode``): the caller's Python path then converts what converts exactly and refuses the rest
with its own messages, so the messages live in one place.

Why C: a Dict(Discrete, Box) action took a dozen NumPy calls per env step in Python (30-50 us);
here it is a few hundred nanoseconds, and a batch of rows is one call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>
#include <stdint.h>
#include <string.h>

#include "_tree.h"

enum form { DISCRETE = 0, CONTINUOUS = 1, HYBRID = 2 };

typedef struct {
    int choice;            /* 1: choices + start, in an integer or bool dtype; 0: floats of a Box */
    int scalar;            /* a choice leaf of shape (): a NumPy scalar (else an array, 0-d for a Box of shape ()) */
    PyArray_Descr *descr;  /* the native dtype */
    int itemsize;
    int ndim;
    npy_intp shape[NPY_MAXDIMS];
    npy_intp size;
    Py_ssize_t first;      /* its first element in the discrete or the continuous part */
} ActLeaf;

typedef struct {
    int form;
    Py_ssize_t ndisc, ncont, nleaves;
    int64_t *nvec;         /* choices per discrete element */
    uint64_t *start;       /* native value of choice 0, modulo 2**64 (a uint64 start may not fit int64) */
    double *low, *high;    /* bounds per continuous element */
    ActLeaf *leaves;
    PyObject *tree;        /* leaf index, or (keys or None, children) for a Dict or a Tuple */
} ActSpec;

static const char *CAPSULE = "packrl.emulation._fastaction.ActSpec";
static PyObject *DISCRETE_KEY, *CONTINUOUS_KEY;  /* "discrete" and "continuous", interned: their hashes are cached */

static void spec_free(PyObject *capsule) {
    ActSpec *spec = (ActSpec *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (spec == NULL) return;
    for (Py_ssize_t i = 0; i < spec->nleaves; i++) Py_XDECREF(spec->leaves[i].descr);
    Py_XDECREF(spec->tree);
    PyMem_Free(spec->nvec);
    PyMem_Free(spec->start);
    PyMem_Free(spec->low);
    PyMem_Free(spec->high);
    PyMem_Free(spec->leaves);
    PyMem_Free(spec);
}

/* A copy of a bytes object holding count items of size bytes each. */
static void *copy_bytes(PyObject *obj, Py_ssize_t count, size_t size) {
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != count * (Py_ssize_t)size) {
        PyErr_SetString(PyExc_ValueError, "bounds must be bytes of one 8-byte item per element");
        return NULL;
    }
    void *out = PyMem_Malloc(count * size + 8);
    if (out == NULL) return PyErr_NoMemory();
    memcpy(out, PyBytes_AS_STRING(obj), count * size);
    return out;
}

/* leaf: (choice, scalar, dtype, shape, first) */
static int parse_leaf(PyObject *item, ActLeaf *leaf, const ActSpec *spec) {
    PyObject *dtype, *shape;
    if (!PyArg_ParseTuple(item, "ppOO!n", &leaf->choice, &leaf->scalar, &dtype, &PyTuple_Type, &shape, &leaf->first))
        return -1;
    if (!PyArray_DescrCheck(dtype)) {
        PyErr_SetString(PyExc_TypeError, "a leaf's dtype must be a numpy.dtype");
        return -1;
    }
    PyArray_Descr *descr = (PyArray_Descr *)dtype;
    int itemsize = (int)PyDataType_ELSIZE(descr);
    int takes = PyArray_ISNBO(descr->byteorder) &&
                (leaf->choice ? strchr("biu", descr->kind) != NULL && (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8)
                              : descr->kind == 'f' && (itemsize == 4 || itemsize == 8));
    if (!takes) {
        PyErr_SetString(PyExc_ValueError, "a choice leaf must be an integer or bool dtype, a Box leaf float32 or float64");
        return -1;
    }
    Py_INCREF(dtype);
    leaf->descr = descr;
    leaf->itemsize = itemsize;
    if (leaf->scalar && PyTuple_GET_SIZE(shape)) {
        PyErr_SetString(PyExc_ValueError, "a scalar leaf's shape is ()");
        return -1;
    }
    if (parse_shape(shape, leaf->shape, &leaf->ndim, &leaf->size) < 0) return -1;
    Py_ssize_t part = leaf->choice ? spec->ndisc : spec->ncont;
    if (leaf->first < 0 || leaf->first + leaf->size > part) {
        PyErr_SetString(PyExc_ValueError, "a leaf's elements lie outside its part");
        return -1;
    }
    return 0;
}

/* The tree must name only leaves of the spec (checked once, so that building it cannot fail on an index). */
static int leaf_of_spec(Py_ssize_t index, void *nleaves) {
    if (index < 0 || index >= *(Py_ssize_t *)nleaves) {
        PyErr_SetString(PyExc_ValueError, "the tree names a leaf the spec does not have");
        return -1;
    }
    return 0;
}

static PyObject *action_spec(PyObject *self, PyObject *args) {
    int form;
    Py_ssize_t ndisc, ncont;
    PyObject *nvec, *start, *low, *high, *leaves, *tree;
    if (!PyArg_ParseTuple(args, "innOOOOO!O", &form, &ndisc, &ncont, &nvec, &start, &low, &high,
                          &PyTuple_Type, &leaves, &tree))
        return NULL;
    if (form < DISCRETE || form > HYBRID || ndisc < 0 || ncont < 0 || (form != CONTINUOUS && !ndisc) ||
        (form != DISCRETE && !ncont) || (form == DISCRETE && ncont) || (form == CONTINUOUS && ndisc)) {
        PyErr_SetString(PyExc_ValueError, "form must be 0 (discrete part only), 1 (continuous only) or 2 (both)");
        return NULL;
    }
    ActSpec *spec = PyMem_Calloc(1, sizeof(ActSpec));
    if (spec == NULL) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(spec, CAPSULE, spec_free);
    if (capsule == NULL) {
        PyMem_Free(spec);
        return NULL;
    }
    spec->form = form;
    spec->ndisc = ndisc;
    spec->ncont = ncont;
    if ((spec->nvec = copy_bytes(nvec, ndisc, 8)) == NULL || (spec->start = copy_bytes(start, ndisc, 8)) == NULL ||
        (spec->low = copy_bytes(low, ncont, 8)) == NULL || (spec->high = copy_bytes(high, ncont, 8)) == NULL)
        goto fail;
    spec->leaves = PyMem_Calloc(PyTuple_GET_SIZE(leaves) + 1, sizeof(ActLeaf));
    if (spec->leaves == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(leaves); i++) {
        spec->nleaves = i + 1;  /* spec_free releases what parse_leaf took, even half-parsed */
        if (parse_leaf(PyTuple_GET_ITEM(leaves, i), &spec->leaves[i], spec) < 0) goto fail;
    }
    if (check_tree(tree, leaf_of_spec, &spec->nleaves) < 0) goto fail;
    Py_INCREF(tree);
    spec->tree = tree;
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* ------------------------------------------------------------ reading the parts */

/* The int64 choices of a discrete part: a C-contiguous native int64 array of `count` elements (any
   shape), or, for a part of one element, a Python int or an int64 NumPy scalar. NULL: not taken. */
static const int64_t *choices_of(PyObject *obj, Py_ssize_t count, int64_t *scratch) {
    if (PyArray_CheckExact(obj)) {
        PyArrayObject *arr = (PyArrayObject *)obj;
        if (PyArray_DESCR(arr)->kind != 'i' || PyArray_ITEMSIZE(arr) != 8 || !PyArray_ISNOTSWAPPED(arr) ||
            !PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || PyArray_SIZE(arr) != count)
            return NULL;
        return (const int64_t *)PyArray_DATA(arr);
    }
    if (count != 1) return NULL;
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return NULL;
        }
        *scratch = (int64_t)value;
        return scratch;
    }
    if (PyArray_IsScalar(obj, LongLong) || PyArray_IsScalar(obj, Long)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
        if (descr == NULL) {
            PyErr_Clear();
            return NULL;
        }
        int int64 = descr->kind == 'i' && PyDataType_ELSIZE(descr) == 8;
        Py_DECREF(descr);
        if (!int64) return NULL;
        PyArray_ScalarAsCtype(obj, scratch);
        return scratch;
    }
    return NULL;
}

/* The values of a continuous part: a C-contiguous native float32 or float64 array of `count`
   elements (any shape), or, for a part of one element, a float or a float32/float64 NumPy scalar;
   *wide says which. NULL: not taken. */
static const char *values_of(PyObject *obj, Py_ssize_t count, int *wide, double *scratch) {
    if (count == 1 && (PyFloat_CheckExact(obj) || PyArray_IsScalar(obj, Double))) {
        *scratch = PyFloat_AS_DOUBLE(obj);  /* a float64 scalar is a float */
        *wide = 1;
        return (const char *)scratch;
    }
    if (count == 1 && PyArray_IsScalar(obj, Float)) {
        *wide = 0;
        return (const char *)&PyArrayScalar_VAL(obj, Float);
    }
    if (!PyArray_CheckExact(obj)) return NULL;
    PyArrayObject *arr = (PyArrayObject *)obj;
    int itemsize = (int)PyArray_ITEMSIZE(arr);
    if (PyArray_DESCR(arr)->kind != 'f' || (itemsize != 4 && itemsize != 8) || !PyArray_ISNOTSWAPPED(arr) ||
        !PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || PyArray_SIZE(arr) != count)
        return NULL;
    *wide = itemsize == 8;
    return PyArray_BYTES(arr);
}

/* A batch part: a C-contiguous native array of rows * count elements whose first axis is the rows
   (or a 1-d array of rows when count is 1). NULL: not taken. */
static const char *rows_of(PyObject *obj, Py_ssize_t count, char kind, int *wide, npy_intp *rows) {
    if (!PyArray_CheckExact(obj)) return NULL;
    PyArrayObject *arr = (PyArrayObject *)obj;
    int itemsize = (int)PyArray_ITEMSIZE(arr);
    if (PyArray_DESCR(arr)->kind != kind || (kind == 'i' ? itemsize != 8 : (itemsize != 4 && itemsize != 8)) ||
        !PyArray_ISNOTSWAPPED(arr) || !PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || PyArray_NDIM(arr) < 1)
        return NULL;
    npy_intp n = PyArray_DIM(arr, 0);
    if (*rows >= 0 && n != *rows) return NULL;
    if (PyArray_SIZE(arr) != n * count || (PyArray_NDIM(arr) == 1 && count != 1)) return NULL;
    *rows = n;
    *wide = itemsize == 8;
    return PyArray_BYTES(arr);
}

/* ------------------------------------------------------------ checking and building */

/* Whether every choice is in [0, n) and every value in [low, high] (NaN is not). No early exit. */
static int inside(const ActSpec *spec, const int64_t *disc, const char *cont, int wide) {
    unsigned char bad = 0;
    for (Py_ssize_t k = 0; k < spec->ndisc; k++)
        bad |= (unsigned char)((disc[k] < 0) | (disc[k] >= spec->nvec[k]));
    if (wide) {
        const double *x = (const double *)cont;
        for (Py_ssize_t k = 0; k < spec->ncont; k++) bad |= (unsigned char)!((x[k] >= spec->low[k]) & (x[k] <= spec->high[k]));
    } else {
        const float *x = (const float *)cont;
        for (Py_ssize_t k = 0; k < spec->ncont; k++)
            bad |= (unsigned char)!(((double)x[k] >= spec->low[k]) & ((double)x[k] <= spec->high[k]));
    }
    return !bad;
}

static inline void store(char *out, npy_intp k, int itemsize, uint64_t v) {
    switch (itemsize) {
    case 1: ((uint8_t *)out)[k] = (uint8_t)v; break;
    case 2: ((uint16_t *)out)[k] = (uint16_t)v; break;
    case 4: ((uint32_t *)out)[k] = (uint32_t)v; break;
    default: ((uint64_t *)out)[k] = v;
    }
}

/* One leaf's native value (a new reference) from checked parts. */
static PyObject *leaf_value(const ActSpec *spec, const ActLeaf *leaf, const int64_t *disc, const char *cont, int wide) {
    if (leaf->choice && leaf->scalar) {
        uint64_t buf[1];  /* aligned, wide enough for any itemsize: store writes the dtype's own bytes */
        store((char *)buf, 0, leaf->itemsize, spec->start[leaf->first] + (uint64_t)disc[leaf->first]);
        return PyArray_Scalar(buf, leaf->descr, NULL);
    }
    Py_INCREF(leaf->descr);  /* PyArray_NewFromDescr steals it */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, leaf->descr, leaf->ndim, (npy_intp *)leaf->shape, NULL, NULL, 0, NULL);
    if (arr == NULL) return NULL;
    char *out = PyArray_BYTES((PyArrayObject *)arr);
    if (leaf->choice) {
        const int64_t *c = disc + leaf->first;
        const uint64_t *s = spec->start + leaf->first;
        for (npy_intp k = 0; k < leaf->size; k++) store(out, k, leaf->itemsize, s[k] + (uint64_t)c[k]);
    } else if (wide) {
        const double *x = (const double *)cont + leaf->first;
        if (leaf->itemsize == 8) memcpy(out, x, (size_t)leaf->size * 8);
        else for (npy_intp k = 0; k < leaf->size; k++) ((float *)out)[k] = (float)x[k];
    } else {
        const float *x = (const float *)cont + leaf->first;
        if (leaf->itemsize == 4) memcpy(out, x, (size_t)leaf->size * 4);
        else for (npy_intp k = 0; k < leaf->size; k++) ((double *)out)[k] = (double)x[k];
    }
    return arr;
}

/* The native structure of the tree from the leaf values (borrowed). */
static PyObject *build(PyObject *node, PyObject *const *values) {
    if (PyLong_CheckExact(node)) {
        PyObject *v = values[PyLong_AsSsize_t(node)];
        Py_INCREF(v);
        return v;
    }
    PyObject *keys = PyTuple_GET_ITEM(node, 0), *children = PyTuple_GET_ITEM(node, 1);
    Py_ssize_t n = PyTuple_GET_SIZE(children);
    PyObject *out = keys == Py_None ? PyTuple_New(n) : PyDict_New();
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *child = build(PyTuple_GET_ITEM(children, k), values);
        if (child == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        if (keys == Py_None) {
            PyTuple_SET_ITEM(out, k, child);
        } else {
            int failed = PyDict_SetItem(out, PyTuple_GET_ITEM(keys, k), child);
            Py_DECREF(child);
            if (failed) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

/* The native action of one checked row (a new reference). */
static PyObject *native(const ActSpec *spec, const int64_t *disc, const char *cont, int wide) {
    PyObject *small[16];
    PyObject **values = spec->nleaves <= 16 ? small : PyMem_Malloc(spec->nleaves * sizeof(PyObject *));
    if (values == NULL) return PyErr_NoMemory();
    Py_ssize_t made = 0;
    PyObject *out = NULL;
    for (; made < spec->nleaves; made++)
        if ((values[made] = leaf_value(spec, &spec->leaves[made], disc, cont, wide)) == NULL) goto done;
    out = build(spec->tree, values);
done:
    for (Py_ssize_t i = 0; i < made; i++) Py_DECREF(values[i]);
    if (values != small) PyMem_Free(values);
    return out;
}

/* ------------------------------------------------------------ the module's functions */

static ActSpec *spec_arg(PyObject *obj) {
    return (ActSpec *)PyCapsule_GetPointer(obj, CAPSULE);
}

static PyObject *decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode(spec, action)");
        return NULL;
    }
    if (args[0] == Py_None) Py_RETURN_NONE;  /* a layout C does not decode (a float16 Box) */
    ActSpec *spec = spec_arg(args[0]);
    if (spec == NULL) return NULL;
    PyObject *action = args[1], *dobj = action, *cobj = action;
    if (spec->form == HYBRID) {
        if (!PyDict_CheckExact(action) || PyDict_GET_SIZE(action) != 2) Py_RETURN_NONE;
        dobj = PyDict_GetItemWithError(action, DISCRETE_KEY);
        cobj = dobj == NULL ? NULL : PyDict_GetItemWithError(action, CONTINUOUS_KEY);
        if (PyErr_Occurred()) return NULL;
        if (dobj == NULL || cobj == NULL) Py_RETURN_NONE;
    }
    int64_t scratch;
    double cscratch;
    const int64_t *disc = NULL;
    const char *cont = NULL;
    int wide = 0;
    if (spec->form != CONTINUOUS && (disc = choices_of(dobj, spec->ndisc, &scratch)) == NULL) Py_RETURN_NONE;
    if (spec->form != DISCRETE && (cont = values_of(cobj, spec->ncont, &wide, &cscratch)) == NULL) Py_RETURN_NONE;
    if (!inside(spec, disc, cont, wide)) Py_RETURN_NONE;
    return native(spec, disc, cont, wide);
}

/* A batch of policy actions: disc (rows, ndisc) int64 and cont (rows, ncont) float32/64 (NULL where the
   form has no such part). */
typedef struct {
    const ActSpec *spec;
    const char *disc, *cont;
    int wide;
    npy_intp rows;
} Batch;

/* check_rows' and decode_rows' arguments (spec, disc, cont) as a Batch. -1: an error is set; 1: not taken
   (the caller returns None); 0: taken. */
static int batch_arg(PyObject *const *args, Py_ssize_t nargs, const char *usage, Batch *b) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if ((b->spec = spec_arg(args[0])) == NULL) return -1;
    int ignored;
    b->rows = -1;
    b->disc = b->cont = NULL;
    b->wide = 0;
    if (b->spec->form != CONTINUOUS && (b->disc = rows_of(args[1], b->spec->ndisc, 'i', &ignored, &b->rows)) == NULL)
        return 1;
    if (b->spec->form != DISCRETE && (b->cont = rows_of(args[2], b->spec->ncont, 'f', &b->wide, &b->rows)) == NULL)
        return 1;
    return 0;
}

static const int64_t *row_disc(const Batch *b, npy_intp r) {
    return b->disc ? (const int64_t *)b->disc + r * b->spec->ndisc : NULL;
}

static const char *row_cont(const Batch *b, npy_intp r) {
    return b->cont ? b->cont + r * (size_t)b->spec->ncont * (b->wide ? 8 : 4) : NULL;
}

/* The first row outside the space, or -1. */
static npy_intp first_bad(const Batch *b) {
    for (npy_intp r = 0; r < b->rows; r++)
        if (!inside(b->spec, row_disc(b, r), row_cont(b, r), b->wide)) return r;
    return -1;
}

static PyObject *check_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Batch b;
    int taken = batch_arg(args, nargs, "check_rows(spec, disc, cont)", &b);
    if (taken < 0) return NULL;
    if (taken > 0) Py_RETURN_NONE;
    return PyLong_FromSsize_t((Py_ssize_t)first_bad(&b));
}

static PyObject *decode_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Batch b;
    int taken = batch_arg(args, nargs, "decode_rows(spec, disc, cont)", &b);
    if (taken < 0) return NULL;
    if (taken > 0) Py_RETURN_NONE;
    npy_intp bad = first_bad(&b);
    if (bad >= 0) return PyLong_FromSsize_t((Py_ssize_t)bad);
    PyObject *out = PyList_New(b.rows);
    if (out == NULL) return NULL;
    for (npy_intp r = 0; r < b.rows; r++) {
        PyObject *v = native(b.spec, row_disc(&b, r), row_cont(&b, r), b.wide);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, r, v);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"action_spec", action_spec, METH_VARARGS,
     "action_spec(form, ndisc, ncont, nvec, start, low, high, leaves, tree) -> spec.\n\n"
     "form: 0 discrete part only, 1 continuous only, 2 both (a dict action). nvec (int64), start (uint64), low and\n"
     "high (float64): bytes, one item per element. leaves: (choice, scalar, dtype, shape, first) each. tree: a leaf\n"
     "index or (keys or None, children)."},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(spec, action) -> the native action, or None when the action is not taken or not inside the space."},
    {"decode_rows", (PyCFunction)(void (*)(void))decode_rows, METH_FASTCALL,
     "decode_rows(spec, disc, cont) -> a list of native actions, the first bad row, or None (not taken)."},
    {"check_rows", (PyCFunction)(void (*)(void))check_rows, METH_FASTCALL,
     "check_rows(spec, disc, cont) -> -1 when every row is inside the space, else the first bad row; None: not taken."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastaction", "Check and decode policy actions.", -1, methods};

PyMODINIT_FUNC PyInit__fastaction(void) {
    import_array();
    DISCRETE_KEY = PyUnicode_InternFromString("discrete");
    CONTINUOUS_KEY = PyUnicode_InternFromString("continuous");
    if (DISCRETE_KEY == NULL || CONTINUOUS_KEY == NULL) return NULL;
    return PyModule_Create(&module);
}
