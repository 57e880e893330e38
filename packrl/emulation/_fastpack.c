/* The compiled pack: walk a sample's Dicts and Tuples, check every leaf, copy it into one packed row.

    pack(spec, sample, rows, r)             -> 0 | k > 0 | -1
    pack_many(spec, samples, rows, first)   -> how many samples were packed before one was not

The spec (make_spec, built by packrl/emulation/compiled.py from a Layout's tree) is the space's
tree, in the style of _fastaction.c: a node index, or (keys or None, children) for a Dict or a
Tuple. Each node is a leaf of one field checked here (exact dtype, shape and integer bounds), or a
leaf whose codec checks it in Python (strings, registered user codecs): its ``check(value, path)``
is called and the arrays it returns are copied. pack returns 0 having written every field into
rows[r] (and zeroed the row's padding), k > 0 when field k - 1 holds a value out of its bounds, -1
when something is not what this function takes (another dtype or container, a codec's refusal).
It writes nothing unless it returns 0, and it only accepts: on k or -1 the caller goes on to the
checked Python path, which converts what converts exactly and names what does not.

It takes arrays of exactly the field's dtype and shape in any memory layout (strided, read-only,
misaligned: gathered first), NumPy scalars of the field's class, and for a Discrete (takes_int)
Python ints and int64 scalars. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>
#include <stdint.h>
#include <string.h>

#include "_tree.h"

#define NOT_TAKEN (-1)
#define OUTSIDE 1    /* (inside the walk) a Discrete's int out of its bounds */
#define FAILED (-2)  /* an exception that must reach the caller (KeyboardInterrupt, MemoryError) */
#define STACK_FIELDS 64

enum bounds_kind { NO_BOUNDS = 0, UNIFORM = 1, ELEMENTWISE = 2 };

typedef struct {
    char kind;                /* 'b', 'i', 'u' or 'f', as NumPy's dtype.kind */
    int itemsize;
    int ndim;
    npy_intp shape[NPY_MAXDIMS];
    npy_intp size;            /* elements */
    Py_ssize_t offset;        /* in the row, bytes */
    int bounds;
    int is_signed;            /* bounds compare as signed ('i') or unsigned ('u', and a bool's bytes) */
    int64_t lo_i, hi_i;       /* UNIFORM bounds, signed */
    uint64_t lo_u, hi_u;      /* UNIFORM bounds, unsigned */
    PyArrayObject *lo_arr, *hi_arr;  /* ELEMENTWISE bounds: C-contiguous, the field's width */
    PyTypeObject *scalar_type;       /* shape (): the NumPy scalar class taken, or NULL */
    int takes_int;            /* shape (): a Python int or an int64 scalar is taken too (Discrete) */
} Field;

typedef struct {
    PyObject *check;          /* NULL: one field checked here; else the codec's check(value, path) */
    PyObject *path;
    Py_ssize_t first, count;  /* its fields */
} Leaf;

typedef struct {
    Py_ssize_t nbytes, nfields, nleaves, ngaps;
    Py_ssize_t *gaps;         /* start, end pairs */
    Field *fields;
    Leaf *leaves;
    PyObject *tree;
} Spec;

typedef struct {              /* one field of the sample being packed */
    const char *data;
    char *gathered;           /* a contiguous copy of a strided or misaligned array (freed after) */
    PyObject *owner;          /* the object data lives in (a reference held) */
    char scratch[8];          /* a scalar's bytes */
} Taken;

static const char *CAPSULE = "packrl.emulation._fastpack.Spec";
static PyTypeObject *INT64_TYPE;

static void spec_free(PyObject *capsule) {
    Spec *spec = (Spec *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (spec == NULL) return;
    for (Py_ssize_t i = 0; i < spec->nfields; i++) {
        Py_XDECREF(spec->fields[i].lo_arr);
        Py_XDECREF(spec->fields[i].hi_arr);
        Py_XDECREF(spec->fields[i].scalar_type);
    }
    for (Py_ssize_t i = 0; i < spec->nleaves; i++) {
        Py_XDECREF(spec->leaves[i].check);
        Py_XDECREF(spec->leaves[i].path);
    }
    Py_XDECREF(spec->tree);
    PyMem_Free(spec->gaps);
    PyMem_Free(spec->fields);
    PyMem_Free(spec->leaves);
    PyMem_Free(spec);
}

/* ------------------------------------------------------------ the spec */

/* Elementwise bounds as the checks read them: C-contiguous, aligned, the field's width and signedness. */
static PyArrayObject *bounds_array(PyObject *obj, const Field *field) {
    if (!PyArray_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "elementwise bounds must be arrays");
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_DESCR(arr)->kind != (field->is_signed ? 'i' : 'u') || PyArray_ITEMSIZE(arr) != field->itemsize ||
        !PyArray_ISCARRAY_RO(arr) || !PyArray_ISNOTSWAPPED(arr) || PyArray_SIZE(arr) != field->size) {
        PyErr_SetString(PyExc_ValueError, "elementwise bounds must be C-contiguous arrays of the field's width and size");
        return NULL;
    }
    Py_INCREF(obj);
    return arr;
}

/* field: (kind, itemsize, shape, offset, lo, hi, scalar_type or None, takes_int) */
static int parse_field(PyObject *item, Field *field, Py_ssize_t nbytes) {
    const char *kind;
    Py_ssize_t kind_len;
    PyObject *shape, *lo, *hi, *scalar_type;
    int takes_int;
    if (!PyArg_ParseTuple(item, "s#iO!nOOOp", &kind, &kind_len, &field->itemsize, &PyTuple_Type, &shape,
                          &field->offset, &lo, &hi, &scalar_type, &takes_int))
        return -1;
    if (kind_len != 1 || !strchr("biuf", kind[0]) ||
        !(field->itemsize == 1 || field->itemsize == 2 || field->itemsize == 4 || field->itemsize == 8)) {
        PyErr_SetString(PyExc_ValueError, "a field's kind must be one of 'biuf' with an itemsize of 1, 2, 4 or 8");
        return -1;
    }
    field->kind = kind[0];
    field->is_signed = field->kind == 'i';
    if (parse_shape(shape, field->shape, &field->ndim, &field->size) < 0) return -1;
    if (field->offset < 0 || field->offset + field->size * field->itemsize > nbytes) {
        PyErr_SetString(PyExc_ValueError, "a field does not fit in the row");
        return -1;
    }
    if (scalar_type != Py_None) {
        if (field->ndim || !PyType_Check(scalar_type)) {
            PyErr_SetString(PyExc_TypeError, "a scalar class is for a field of shape () and must be a NumPy scalar class");
            return -1;
        }
        PyArray_Descr *descr = PyArray_DescrFromTypeObject(scalar_type);
        if (descr == NULL) return -1;
        int same = descr->kind == field->kind && PyDataType_ELSIZE(descr) == field->itemsize &&
                   PyArray_ISNBO(descr->byteorder);
        Py_DECREF(descr);
        if (!same) {
            PyErr_SetString(PyExc_ValueError, "a scalar class must have the field's dtype");
            return -1;
        }
        Py_INCREF(scalar_type);
        field->scalar_type = (PyTypeObject *)scalar_type;
    }
    if (lo == Py_None && hi == Py_None) {
        field->bounds = NO_BOUNDS;
    } else if (field->kind == 'f') {
        PyErr_SetString(PyExc_ValueError, "only integer and bool fields have bounds");
        return -1;
    } else if (PyLong_Check(lo) && PyLong_Check(hi)) {
        field->bounds = UNIFORM;
        if (field->is_signed) {
            field->lo_i = PyLong_AsLongLong(lo);
            field->hi_i = PyLong_AsLongLong(hi);
        } else {
            field->lo_u = PyLong_AsUnsignedLongLong(lo);
            field->hi_u = PyLong_AsUnsignedLongLong(hi);
        }
        if (PyErr_Occurred()) return -1;
    } else {
        field->bounds = ELEMENTWISE;
        if ((field->lo_arr = bounds_array(lo, field)) == NULL) return -1;
        if ((field->hi_arr = bounds_array(hi, field)) == NULL) return -1;
    }
    if (takes_int && (field->ndim || field->kind == 'f' || field->kind == 'b' || field->bounds != UNIFORM)) {
        PyErr_SetString(PyExc_ValueError, "a field that takes Python ints is an integer of shape () with bounds");
        return -1;
    }
    field->takes_int = takes_int;
    return 0;
}

/* leaf: (check or None, path, first field, field count) */
static int parse_leaf(PyObject *item, Leaf *leaf, Py_ssize_t *next_field, Py_ssize_t nfields) {
    PyObject *check, *path;
    if (!PyArg_ParseTuple(item, "OOnn", &check, &path, &leaf->first, &leaf->count)) return -1;
    if (leaf->first != *next_field || leaf->count < 1 || leaf->first + leaf->count > nfields ||
        (check == Py_None && leaf->count != 1) || (check != Py_None && !PyCallable_Check(check))) {
        PyErr_SetString(PyExc_ValueError, "leaves take the fields in order, one field unless a callable check takes several");
        return -1;
    }
    *next_field += leaf->count;
    if (check != Py_None) {
        Py_INCREF(check);
        leaf->check = check;
    }
    Py_INCREF(path);
    leaf->path = path;
    return 0;
}

/* The tree must name every leaf once, in order (so a walk that succeeds has taken every field). */
static int next_leaf_in_order(Py_ssize_t index, void *next_leaf) {
    Py_ssize_t *next = (Py_ssize_t *)next_leaf;
    if (index != *next) {
        PyErr_SetString(PyExc_ValueError, "the tree must name the leaves once each, in order");
        return -1;
    }
    *next += 1;
    return 0;
}

static PyObject *make_spec(PyObject *self, PyObject *args) {
    Py_ssize_t nbytes;
    PyObject *gaps, *fields, *leaves, *tree;
    if (!PyArg_ParseTuple(args, "nO!O!O!O", &nbytes, &PyTuple_Type, &gaps, &PyTuple_Type, &fields,
                          &PyTuple_Type, &leaves, &tree))
        return NULL;
    Spec *spec = PyMem_Calloc(1, sizeof(Spec));
    if (spec == NULL) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(spec, CAPSULE, spec_free);
    if (capsule == NULL) {
        PyMem_Free(spec);
        return NULL;
    }
    spec->nbytes = nbytes;
    spec->ngaps = PyTuple_GET_SIZE(gaps);
    spec->gaps = PyMem_Calloc(2 * spec->ngaps + 1, sizeof(Py_ssize_t));
    spec->fields = PyMem_Calloc(PyTuple_GET_SIZE(fields) + 1, sizeof(Field));
    spec->leaves = PyMem_Calloc(PyTuple_GET_SIZE(leaves) + 1, sizeof(Leaf));
    if (spec->gaps == NULL || spec->fields == NULL || spec->leaves == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t g = 0; g < spec->ngaps; g++) {
        Py_ssize_t start, end;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(gaps, g), "nn", &start, &end)) goto fail;
        if (start < 0 || end < start || end > nbytes) {
            PyErr_SetString(PyExc_ValueError, "a gap outside the row");
            goto fail;
        }
        spec->gaps[2 * g] = start;
        spec->gaps[2 * g + 1] = end;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
        spec->nfields = i + 1;  /* spec_free releases what parse_field took, even half-parsed */
        if (parse_field(PyTuple_GET_ITEM(fields, i), &spec->fields[i], nbytes) < 0) goto fail;
    }
    Py_ssize_t next_field = 0, next_leaf = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(leaves); i++) {
        spec->nleaves = i + 1;
        if (parse_leaf(PyTuple_GET_ITEM(leaves, i), &spec->leaves[i], &next_field, spec->nfields) < 0) goto fail;
    }
    if (next_field != spec->nfields) {
        PyErr_SetString(PyExc_ValueError, "the leaves must take every field");
        goto fail;
    }
    if (check_tree(tree, next_leaf_in_order, &next_leaf) < 0) goto fail;
    if (next_leaf != spec->nleaves) {
        PyErr_SetString(PyExc_ValueError, "the tree must name the leaves once each, in order");
        goto fail;
    }
    Py_INCREF(tree);
    spec->tree = tree;
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* ------------------------------------------------------------ checks */

/* Whether any element of a field (contiguous at data) is out of bounds. No early exit: the loops
   stay branch-free and vectorize. */
#define OUTSIDE_UNIFORM(T, LO, HI)                                   \
    do {                                                             \
        const T *x = (const T *)data;                                \
        const T lo = (T)(LO), hi = (T)(HI);                          \
        unsigned char bad = 0;                                       \
        for (npy_intp k = 0; k < field->size; k++)                   \
            bad |= (unsigned char)((x[k] < lo) | (x[k] > hi));       \
        return bad;                                                  \
    } while (0)

#define OUTSIDE_ELEMENTWISE(T)                                       \
    do {                                                             \
        const T *x = (const T *)data;                                \
        const T *lo = (const T *)PyArray_DATA(field->lo_arr);        \
        const T *hi = (const T *)PyArray_DATA(field->hi_arr);        \
        unsigned char bad = 0;                                       \
        for (npy_intp k = 0; k < field->size; k++)                   \
            bad |= (unsigned char)((x[k] < lo[k]) | (x[k] > hi[k])); \
        return bad;                                                  \
    } while (0)

/* One case per integer width; PREFIX is empty for the signed types and u for the unsigned ones. */
#define BY_WIDTH(PREFIX, MACRO, ...)                \
    switch (field->itemsize) {                      \
    case 1: MACRO(PREFIX##int8_t, ##__VA_ARGS__);   \
    case 2: MACRO(PREFIX##int16_t, ##__VA_ARGS__);  \
    case 4: MACRO(PREFIX##int32_t, ##__VA_ARGS__);  \
    default: MACRO(PREFIX##int64_t, ##__VA_ARGS__); \
    }

/* The checks vectorize: built for the CPU at hand among these, chosen when the module loads
   (SSE2 alone measured 1.7x slower than AVX2 on the NetHack-like sample's checks). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

VECTOR_CLONES
static int outside(const Field *field, const char *data) {
    if (field->bounds == UNIFORM) {
        if (field->is_signed) BY_WIDTH(, OUTSIDE_UNIFORM, field->lo_i, field->hi_i)
        else BY_WIDTH(u, OUTSIDE_UNIFORM, field->lo_u, field->hi_u)
    } else if (field->bounds == ELEMENTWISE) {
        if (field->is_signed) BY_WIDTH(, OUTSIDE_ELEMENTWISE)
        else BY_WIDTH(u, OUTSIDE_ELEMENTWISE)
    }
    return 0;
}

/* ------------------------------------------------------------ taking a leaf */

/* A Discrete's Python int or int64 scalar: inside the bounds, its bytes in the field's width; else OUTSIDE. */
static int take_int(const Field *field, PyObject *obj, Taken *taken) {
    int overflow;
    long long value;
    if (Py_TYPE(obj) == INT64_TYPE) {
        int64_t scalar;
        PyArray_ScalarAsCtype(obj, &scalar);
        value = scalar;
        overflow = 0;
    } else {
        value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (value == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NOT_TAKEN;
        }
    }
    uint64_t bits;
    if (field->is_signed) {
        if (overflow || value < field->lo_i || value > field->hi_i) return OUTSIDE;
        bits = (uint64_t)value;
    } else if (overflow > 0) {
        unsigned long long big = PyLong_AsUnsignedLongLong(obj);
        if (big == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return OUTSIDE;  /* beyond uint64 */
        }
        if (big < field->lo_u || big > field->hi_u) return OUTSIDE;
        bits = big;
    } else {
        if (overflow || value < 0 || (uint64_t)value < field->lo_u || (uint64_t)value > field->hi_u) return OUTSIDE;
        bits = (uint64_t)value;
    }
    /* inside the bounds, so inside the field's width: keep its low bytes (little- or big-endian) */
    switch (field->itemsize) {
    case 1: { uint8_t v = (uint8_t)bits; memcpy(taken->scratch, &v, 1); break; }
    case 2: { uint16_t v = (uint16_t)bits; memcpy(taken->scratch, &v, 2); break; }
    case 4: { uint32_t v = (uint32_t)bits; memcpy(taken->scratch, &v, 4); break; }
    default: memcpy(taken->scratch, &bits, 8);
    }
    taken->data = taken->scratch;
    return 0;
}

/* Copy a strided (or misaligned) array's elements into a contiguous buffer, in C order. */
static void gather(PyArrayObject *arr, char *out, int itemsize) {
    int ndim = PyArray_NDIM(arr);
    const npy_intp *dims = PyArray_DIMS(arr), *strides = PyArray_STRIDES(arr);
    npy_intp index[NPY_MAXDIMS] = {0};
    const char *base = PyArray_BYTES(arr);
    npy_intp total = PyArray_SIZE(arr);
    for (npy_intp k = 0; k < total; k++) {
        const char *at = base;
        for (int d = 0; d < ndim; d++) at += index[d] * strides[d];
        memcpy(out + k * itemsize, at, (size_t)itemsize);
        for (int d = ndim - 1; d >= 0; d--) {
            if (++index[d] < dims[d]) break;
            index[d] = 0;
        }
    }
}

/* An array of exactly the field's dtype and shape, in any memory layout: 0 with taken->data set,
   NOT_TAKEN, or FAILED (out of memory). */
static int take_array(const Field *field, PyObject *obj, Taken *taken) {
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_NDIM(arr) != field->ndim || PyArray_DESCR(arr)->kind != field->kind ||
        PyArray_ITEMSIZE(arr) != field->itemsize || !PyArray_ISNOTSWAPPED(arr))
        return NOT_TAKEN;
    const npy_intp *dims = PyArray_DIMS(arr);
    for (int d = 0; d < field->ndim; d++)
        if (dims[d] != field->shape[d]) return NOT_TAKEN;
    if (PyArray_IS_C_CONTIGUOUS(arr) && PyArray_ISALIGNED(arr)) {
        taken->data = PyArray_BYTES(arr);
        return 0;
    }
    taken->gathered = PyMem_Malloc((size_t)(field->size * field->itemsize) + 1);
    if (taken->gathered == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    gather(arr, taken->gathered, field->itemsize);
    taken->data = taken->gathered;
    return 0;
}

/* One field's value: 0 (taken->data set), OUTSIDE, NOT_TAKEN or FAILED; bounds are checked after. */
static int take_field(const Field *field, PyObject *obj, Taken *taken) {
    int status;
    if (PyArray_CheckExact(obj)) {
        status = take_array(field, obj, taken);
    } else if (field->ndim == 0 && field->takes_int && (PyLong_CheckExact(obj) || Py_TYPE(obj) == INT64_TYPE)) {
        status = take_int(field, obj, taken);
    } else if (field->ndim == 0 && field->scalar_type != NULL && Py_TYPE(obj) == field->scalar_type) {
        PyArray_ScalarAsCtype(obj, taken->scratch);  /* the bytes, as they are (a NaN keeps its payload) */
        taken->data = taken->scratch;
        status = 0;
    } else {
        return NOT_TAKEN;
    }
    if (status == 0) {
        Py_INCREF(obj);
        taken->owner = obj;
    }
    return status;
}

/* A leaf whose codec checks it: the arrays check(value, path) returns, one per field. An exception
   the codec raises means "not taken" (the checked path raises it again, with its context). */
static int take_checked(const Spec *spec, const Leaf *leaf, PyObject *value, Taken *taken) {
    PyObject *arrays = PyObject_CallFunctionObjArgs(leaf->check, value, leaf->path, NULL);
    if (arrays == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return FAILED;
        PyErr_Clear();
        return NOT_TAKEN;
    }
    int status = 0;
    if (!PyTuple_Check(arrays) || PyTuple_GET_SIZE(arrays) != leaf->count) status = NOT_TAKEN;
    for (Py_ssize_t j = 0; j < leaf->count && status == 0; j++) {
        PyObject *arr = PyTuple_GET_ITEM(arrays, j);
        status = PyArray_CheckExact(arr) ? take_array(&spec->fields[leaf->first + j], arr, &taken[leaf->first + j])
                                         : NOT_TAKEN;
        if (status == 0) {
            Py_INCREF(arr);
            taken[leaf->first + j].owner = arr;
        }
    }
    Py_DECREF(arrays);
    return status;
}

/* ------------------------------------------------------------ the walk */

static int walk(const Spec *spec, PyObject *node, PyObject *value, Taken *taken);

/* A Dict node: a dict with exactly its keys (a subclass's own __getitem__ is honoured). */
static int walk_dict(const Spec *spec, PyObject *keys, PyObject *children, PyObject *value, Taken *taken) {
    if (!PyDict_Check(value) || PyDict_GET_SIZE(value) != PyTuple_GET_SIZE(keys)) return NOT_TAKEN;
    int exact = PyDict_CheckExact(value);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        PyObject *child;
        if (exact) {
            child = PyDict_GetItemWithError(value, PyTuple_GET_ITEM(keys, k));
            Py_XINCREF(child);
        } else {
            child = PyObject_GetItem(value, PyTuple_GET_ITEM(keys, k));
        }
        if (child == NULL) {
            if (PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_Exception)) return FAILED;
                PyErr_Clear();
            }
            return NOT_TAKEN;
        }
        int status = walk(spec, PyTuple_GET_ITEM(children, k), child, taken);
        Py_DECREF(child);
        if (status) return status;
    }
    return 0;
}

/* A Tuple node: a tuple or a list of its length (other sequences go to the checked path). */
static int walk_tuple(const Spec *spec, PyObject *children, PyObject *value, Taken *taken) {
    Py_ssize_t n = PyTuple_GET_SIZE(children);
    int is_tuple = PyTuple_CheckExact(value);
    if (!is_tuple && !PyList_CheckExact(value)) return NOT_TAKEN;
    if (Py_SIZE(value) != n) return NOT_TAKEN;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!is_tuple && PyList_GET_SIZE(value) != n) return NOT_TAKEN;  /* a codec changed the list */
        PyObject *child = is_tuple ? PyTuple_GET_ITEM(value, k) : PyList_GET_ITEM(value, k);
        Py_INCREF(child);
        int status = walk(spec, PyTuple_GET_ITEM(children, k), child, taken);
        Py_DECREF(child);
        if (status) return status;
    }
    return 0;
}

/* Take every field under node from value and check its bounds: 0, k > 0 (field k - 1 out of its
   bounds), NOT_TAKEN or FAILED. Nothing is written. */
static int walk(const Spec *spec, PyObject *node, PyObject *value, Taken *taken) {
    if (PyLong_CheckExact(node)) {
        const Leaf *leaf = &spec->leaves[PyLong_AsSsize_t(node)];
        if (leaf->check != NULL) return take_checked(spec, leaf, value, taken);
        const Field *field = &spec->fields[leaf->first];
        int status = take_field(field, value, &taken[leaf->first]);
        if (status == OUTSIDE || (status == 0 && outside(field, taken[leaf->first].data))) return (int)(leaf->first + 1);
        return status;
    }
    PyObject *keys = PyTuple_GET_ITEM(node, 0), *children = PyTuple_GET_ITEM(node, 1);
    if (Py_EnterRecursiveCall(" in packrl's pack")) return FAILED;
    int status = keys == Py_None ? walk_tuple(spec, children, value, taken)
                                 : walk_dict(spec, keys, children, value, taken);
    Py_LeaveRecursiveCall();
    return status;
}

/* The writable C-contiguous uint8 rows, (N, nbytes) or one (nbytes,) row; NULL with an exception else. */
static char *rows_of(const Spec *spec, PyObject *obj, Py_ssize_t *count) {
    if (!PyArray_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a NumPy array");
        return NULL;
    }
    PyArrayObject *rows = (PyArrayObject *)obj;
    int ndim = PyArray_NDIM(rows);
    if ((ndim != 1 && ndim != 2) || PyArray_TYPE(rows) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(rows) ||
        !PyArray_ISWRITEABLE(rows) || PyArray_DIM(rows, ndim - 1) != spec->nbytes) {
        PyErr_Format(PyExc_ValueError, "rows must be a writable C-contiguous (N, %zd) or (%zd,) uint8 array",
                     spec->nbytes, spec->nbytes);
        return NULL;
    }
    *count = ndim == 1 ? 1 : PyArray_DIM(rows, 0);
    return PyArray_BYTES(rows);
}

/* Check one sample and, when every field passed, write it into row. */
static int pack_one(const Spec *spec, PyObject *sample, char *row) {
    Taken stack[STACK_FIELDS];
    Taken *taken = spec->nfields <= STACK_FIELDS ? stack : PyMem_Calloc((size_t)spec->nfields, sizeof(Taken));
    if (taken == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    if (taken == stack) memset(stack, 0, sizeof(Taken) * (size_t)spec->nfields);
    int status = walk(spec, spec->tree, sample, taken);  /* every check before any write */
    if (status == 0) {
        for (Py_ssize_t i = 0; i < spec->nfields; i++) {
            const Field *field = &spec->fields[i];
            /* memmove: a field may view the row itself */
            memmove(row + field->offset, taken[i].data, (size_t)(field->size * field->itemsize));
        }
        for (Py_ssize_t g = 0; g < spec->ngaps; g++)
            memset(row + spec->gaps[2 * g], 0, (size_t)(spec->gaps[2 * g + 1] - spec->gaps[2 * g]));
    }
    for (Py_ssize_t i = 0; i < spec->nfields; i++) {
        PyMem_Free(taken[i].gathered);
        Py_XDECREF(taken[i].owner);
    }
    if (taken != stack) PyMem_Free(taken);
    return status;
}

static Spec *spec_of(PyObject *capsule) {
    return (Spec *)PyCapsule_GetPointer(capsule, CAPSULE);
}

/* The spec, the rows (their count) and the row index of pack's and pack_many's arguments (spec, sample(s), rows,
   index); NULL with the error set when one is not what it must be. */
static char *target_rows(PyObject *const *args, Spec **spec, Py_ssize_t *count, Py_ssize_t *index) {
    *spec = spec_of(args[0]);
    char *rows = *spec == NULL ? NULL : rows_of(*spec, args[2], count);
    if (rows == NULL) return NULL;
    *index = PyNumber_AsSsize_t(args[3], PyExc_IndexError);
    return *index == -1 && PyErr_Occurred() ? NULL : rows;
}

static PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pack(spec, sample, rows, r)");
        return NULL;
    }
    Spec *spec;
    Py_ssize_t count, r;
    char *rows = target_rows(args, &spec, &count, &r);
    if (rows == NULL) return NULL;
    if (r < 0 || r >= count) {
        PyErr_Format(PyExc_IndexError, "row %zd of %zd", r, count);
        return NULL;
    }
    int status = pack_one(spec, args[1], rows + r * spec->nbytes);
    return status == FAILED ? NULL : PyLong_FromLong(status);
}

static PyObject *pack_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack_many(spec, samples: list, rows, first)");
        return NULL;
    }
    Spec *spec;
    Py_ssize_t count, first;
    char *rows = target_rows(args, &spec, &count, &first);
    if (rows == NULL) return NULL;
    PyObject *samples = args[1];
    if (first < 0 || first + PyList_GET_SIZE(samples) > count) {
        PyErr_Format(PyExc_IndexError, "rows %zd to %zd of %zd", first, first + PyList_GET_SIZE(samples), count);
        return NULL;
    }
    Py_ssize_t i = 0;
    for (; i < PyList_GET_SIZE(samples); i++) {  /* (the list's size is read again: a codec may change it) */
        if (first + i >= count) break;
        PyObject *sample = PyList_GET_ITEM(samples, i);
        Py_INCREF(sample);
        int status = pack_one(spec, sample, rows + (first + i) * spec->nbytes);
        Py_DECREF(sample);
        if (status == FAILED) return NULL;
        if (status) break;
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"make_spec", make_spec, METH_VARARGS,
     "make_spec(nbytes, gaps, fields, leaves, tree) -> spec: what pack checks and where it writes.\n\n"
     "fields: (kind, itemsize, shape, offset, lo, hi, scalar_type or None, takes_int) each, in row order of ids;\n"
     "leaves: (check or None, path, first field, field count) each; tree: a leaf index, or (keys or None, children)."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(spec, sample, rows, r) -> 0 (written), k > 0 (field k - 1 out of bounds) or -1 (not taken)."},
    {"pack_many", (PyCFunction)(void (*)(void))pack_many, METH_FASTCALL,
     "pack_many(spec, samples, rows, first) -> how many samples were written into rows[first:] before one was not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpack",
                                    "Walk a sample's tree, check its leaves and copy them into a packed row.", -1, methods};

PyMODINIT_FUNC PyInit__fastpack(void) {
    import_array();
    INT64_TYPE = (PyTypeObject *)PyArray_TypeObjectFromType(NPY_INT64);
    if (INT64_TYPE == NULL) return NULL;
    return PyModule_Create(&module);
}
