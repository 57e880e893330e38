/* The C half of the compiled pack: check a sample's leaves and copy them into one packed row.

Called from a layout's generated module (packrl/emulation/compiled.py) as

    pack(spec, rows, r, leaf0, leaf1, ...) -> 0 | k > 0 | -1

with the leaves already taken out of the sample's Dicts and Tuples. It returns 0 having written
every leaf into rows[r] (and zeroed the padding), k > 0 when leaf k - 1 holds a value out of its
bounds, -1 when a leaf is not what this function takes (another dtype or rank, byte-swapped,
strided, misaligned, another kind of object). It writes nothing unless it returns 0, and it only
accepts: on k or -1 the caller goes on to the Numba kernel and the checked Python path, which
convert what converts exactly and name what does not.

Why C: a Numba call spends about 0.3 us typing and unboxing a dozen array arguments, as much as
the checks and copies themselves; here each leaf costs a few field reads. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>
#include <stdint.h>
#include <string.h>

#define MAX_LEAVES 256
#define NOT_TAKEN (-1)

enum bounds_kind { NO_BOUNDS = 0, UNIFORM = 1, ELEMENTWISE = 2 };

typedef struct {
    char kind;                /* 'b', 'i', 'u' or 'f', as NumPy's dtype.kind */
    int itemsize;
    int ndim;                 /* -1: a scalar argument (Python int or an exact NumPy scalar) */
    npy_intp shape[NPY_MAXDIMS];
    npy_intp size;            /* elements */
    Py_ssize_t offset;        /* in the row, bytes */
    int bounds;
    int64_t lo_i, hi_i;       /* UNIFORM bounds of a signed leaf */
    uint64_t lo_u, hi_u;      /* UNIFORM bounds of an unsigned leaf */
    PyArrayObject *lo_arr, *hi_arr;  /* ELEMENTWISE bounds: C-contiguous, the leaf's dtype */
    PyTypeObject *scalar_type;       /* scalars: the one NumPy scalar class taken */
    int takes_int;            /* scalars: a Python int is taken too (an int64 Discrete) */
} LeafSpec;

typedef struct {
    Py_ssize_t nbytes;
    Py_ssize_t nleaves;
    Py_ssize_t ngaps;
    Py_ssize_t *gaps;         /* start, end pairs */
    LeafSpec *leaves;
} Spec;

static const char *CAPSULE = "packrl.emulation._fastpack.Spec";

static void spec_free(PyObject *capsule) {
    Spec *spec = (Spec *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (spec == NULL) return;
    for (Py_ssize_t i = 0; i < spec->nleaves; i++) {
        Py_XDECREF(spec->leaves[i].lo_arr);
        Py_XDECREF(spec->leaves[i].hi_arr);
        Py_XDECREF(spec->leaves[i].scalar_type);
    }
    PyMem_Free(spec->gaps);
    PyMem_Free(spec->leaves);
    PyMem_Free(spec);
}

/* A bounds array as the kernel reads it: C-contiguous, aligned, the leaf's kind and itemsize, size elements. */
static PyArrayObject *bounds_array(PyObject *obj, const LeafSpec *leaf) {
    if (!PyArray_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "elementwise bounds must be arrays");
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_DESCR(arr)->kind != leaf->kind || PyArray_ITEMSIZE(arr) != leaf->itemsize ||
        !PyArray_ISCARRAY_RO(arr) || !PyArray_ISNOTSWAPPED(arr) || PyArray_SIZE(arr) != leaf->size) {
        PyErr_SetString(PyExc_ValueError, "elementwise bounds must be C-contiguous arrays of the leaf's dtype and size");
        return NULL;
    }
    Py_INCREF(obj);
    return arr;
}

/* leaf: (kind, itemsize, shape or None, offset, lo, hi, scalar_type or None, takes_int) */
static int parse_leaf(PyObject *item, LeafSpec *leaf, Py_ssize_t nbytes) {
    const char *kind;
    Py_ssize_t kind_len;
    PyObject *shape, *lo, *hi, *scalar_type;
    int takes_int;
    memset(leaf, 0, sizeof(*leaf));
    if (!PyArg_ParseTuple(item, "s#iOnOOOp", &kind, &kind_len, &leaf->itemsize, &shape, &leaf->offset,
                          &lo, &hi, &scalar_type, &takes_int))
        return -1;
    if (kind_len != 1 || !strchr("biuf", kind[0]) ||
        !(leaf->itemsize == 1 || leaf->itemsize == 2 || leaf->itemsize == 4 || leaf->itemsize == 8)) {
        PyErr_SetString(PyExc_ValueError, "a leaf's kind must be one of 'biuf' with an itemsize of 1, 2, 4 or 8");
        return -1;
    }
    leaf->kind = kind[0];
    leaf->takes_int = takes_int;
    leaf->size = 1;
    if (shape == Py_None) {
        leaf->ndim = -1;
        if (!PyType_Check(scalar_type)) {
            PyErr_SetString(PyExc_TypeError, "a scalar leaf needs its NumPy scalar class");
            return -1;
        }
        if (takes_int && (leaf->kind != 'i' || leaf->itemsize != 8)) {
            PyErr_SetString(PyExc_ValueError, "only an int64 scalar leaf takes Python ints");
            return -1;
        }
        PyArray_Descr *descr = PyArray_DescrFromTypeObject(scalar_type);
        if (descr == NULL) return -1;
        int same = descr->kind == leaf->kind && PyDataType_ELSIZE(descr) == leaf->itemsize &&
                   PyArray_ISNBO(descr->byteorder);
        Py_DECREF(descr);
        if (!same) {
            PyErr_SetString(PyExc_ValueError, "a scalar leaf's class must have the leaf's dtype");
            return -1;
        }
        Py_INCREF(scalar_type);
        leaf->scalar_type = (PyTypeObject *)scalar_type;
    } else {
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
            PyErr_SetString(PyExc_ValueError, "a leaf's shape must be a tuple of at most NPY_MAXDIMS ints");
            return -1;
        }
        leaf->ndim = (int)PyTuple_GET_SIZE(shape);
        for (int d = 0; d < leaf->ndim; d++) {
            leaf->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (leaf->shape[d] < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative dimension");
                return -1;
            }
            leaf->size *= leaf->shape[d];
        }
    }
    if (leaf->offset < 0 || leaf->offset + leaf->size * leaf->itemsize > nbytes) {
        PyErr_SetString(PyExc_ValueError, "a leaf does not fit in the row");
        return -1;
    }
    if (lo == Py_None && hi == Py_None) {
        leaf->bounds = NO_BOUNDS;
    } else if (leaf->kind != 'i' && leaf->kind != 'u') {
        PyErr_SetString(PyExc_ValueError, "only integer leaves have bounds");
        return -1;
    } else if (PyLong_Check(lo) && PyLong_Check(hi)) {
        leaf->bounds = UNIFORM;
        if (leaf->kind == 'i') {
            leaf->lo_i = PyLong_AsLongLong(lo);
            leaf->hi_i = PyLong_AsLongLong(hi);
        } else {
            leaf->lo_u = PyLong_AsUnsignedLongLong(lo);
            leaf->hi_u = PyLong_AsUnsignedLongLong(hi);
        }
        if (PyErr_Occurred()) return -1;
    } else {
        leaf->bounds = ELEMENTWISE;
        if ((leaf->lo_arr = bounds_array(lo, leaf)) == NULL) return -1;
        if ((leaf->hi_arr = bounds_array(hi, leaf)) == NULL) return -1;
    }
    return 0;
}

static PyObject *make_spec(PyObject *self, PyObject *args) {
    Py_ssize_t nbytes;
    PyObject *gaps, *leaves;
    if (!PyArg_ParseTuple(args, "nO!O!", &nbytes, &PyTuple_Type, &gaps, &PyTuple_Type, &leaves)) return NULL;
    if (PyTuple_GET_SIZE(leaves) > MAX_LEAVES) {
        PyErr_Format(PyExc_ValueError, "at most %d leaves", MAX_LEAVES);
        return NULL;
    }
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
    spec->leaves = PyMem_Calloc(PyTuple_GET_SIZE(leaves) + 1, sizeof(LeafSpec));
    if (spec->gaps == NULL || spec->leaves == NULL) {
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
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(leaves); i++) {
        spec->nleaves = i + 1;  /* spec_free releases what parse_leaf took, even half-parsed */
        if (parse_leaf(PyTuple_GET_ITEM(leaves, i), &spec->leaves[i], nbytes) < 0) goto fail;
    }
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* Whether any element of a C-contiguous leaf is out of bounds. No early exit: the loops stay
   branch-free and vectorize. */
#define OUTSIDE_UNIFORM(T, LO, HI)                                   \
    do {                                                             \
        const T *x = (const T *)data;                                \
        const T lo = (T)(LO), hi = (T)(HI);                          \
        unsigned char bad = 0;                                       \
        for (npy_intp k = 0; k < leaf->size; k++)                    \
            bad |= (unsigned char)((x[k] < lo) | (x[k] > hi));       \
        return bad;                                                  \
    } while (0)

#define OUTSIDE_ELEMENTWISE(T)                                       \
    do {                                                             \
        const T *x = (const T *)data;                                \
        const T *lo = (const T *)PyArray_DATA(leaf->lo_arr);         \
        const T *hi = (const T *)PyArray_DATA(leaf->hi_arr);         \
        unsigned char bad = 0;                                       \
        for (npy_intp k = 0; k < leaf->size; k++)                    \
            bad |= (unsigned char)((x[k] < lo[k]) | (x[k] > hi[k])); \
        return bad;                                                  \
    } while (0)

/* One case per integer width; PREFIX is empty for the signed types and u for the unsigned ones. */
#define BY_WIDTH(PREFIX, MACRO, ...)                \
    switch (leaf->itemsize) {                       \
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
static int outside(const LeafSpec *leaf, const char *data) {
    if (leaf->bounds == UNIFORM) {
        if (leaf->kind == 'i') BY_WIDTH(, OUTSIDE_UNIFORM, leaf->lo_i, leaf->hi_i)
        else BY_WIDTH(u, OUTSIDE_UNIFORM, leaf->lo_u, leaf->hi_u)
    } else if (leaf->bounds == ELEMENTWISE) {
        if (leaf->kind == 'i') BY_WIDTH(, OUTSIDE_ELEMENTWISE)
        else BY_WIDTH(u, OUTSIDE_ELEMENTWISE)
    }
    return 0;
}

/* The bytes of a scalar argument, written into scratch (8 bytes); NULL if it is not taken. */
static const char *scalar_bytes(const LeafSpec *leaf, PyObject *obj, char *scratch) {
    if (leaf->takes_int && PyLong_CheckExact(obj)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return NULL;
        }
        int64_t exact = (int64_t)value;
        memcpy(scratch, &exact, sizeof(exact));
        return scratch;
    }
    if (Py_TYPE(obj) != leaf->scalar_type) return NULL;  /* its dtype checked by make_spec */
    PyArray_ScalarAsCtype(obj, scratch);
    return scratch;
}

/* The data of an array argument that is exactly what the leaf takes; NULL if it is not. */
static const char *array_bytes(const LeafSpec *leaf, PyObject *obj) {
    if (!PyArray_CheckExact(obj)) return NULL;
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_NDIM(arr) != leaf->ndim || PyArray_DESCR(arr)->kind != leaf->kind ||
        PyArray_ITEMSIZE(arr) != leaf->itemsize || !PyArray_ISNOTSWAPPED(arr) ||
        !PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr))
        return NULL;
    const npy_intp *dims = PyArray_DIMS(arr);
    for (int d = 0; d < leaf->ndim; d++)
        if (dims[d] != leaf->shape[d]) return NULL;
    return PyArray_BYTES(arr);
}

static PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3) {
        PyErr_SetString(PyExc_TypeError, "pack(spec, rows, r, *leaves)");
        return NULL;
    }
    Spec *spec = (Spec *)PyCapsule_GetPointer(args[0], CAPSULE);
    if (spec == NULL) return NULL;
    if (nargs != 3 + spec->nleaves) {
        PyErr_Format(PyExc_TypeError, "pack takes %zd leaves, got %zd", spec->nleaves, nargs - 3);
        return NULL;
    }
    if (!PyArray_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "rows must be a NumPy array");
        return NULL;
    }
    PyArrayObject *rows = (PyArrayObject *)args[1];
    if (PyArray_NDIM(rows) != 2 || PyArray_TYPE(rows) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(rows) ||
        !PyArray_ISWRITEABLE(rows) || PyArray_DIM(rows, 1) != spec->nbytes) {
        PyErr_Format(PyExc_ValueError, "rows must be a writable C-contiguous (N, %zd) uint8 array", spec->nbytes);
        return NULL;
    }
    Py_ssize_t r = PyNumber_AsSsize_t(args[2], PyExc_IndexError);
    if (r == -1 && PyErr_Occurred()) return NULL;
    if (r < 0 || r >= PyArray_DIM(rows, 0)) {
        PyErr_Format(PyExc_IndexError, "row %zd of %zd", r, (Py_ssize_t)PyArray_DIM(rows, 0));
        return NULL;
    }
    /* every check before any write: a refused sample leaves the row as it was */
    const char *data[MAX_LEAVES];
    char scratch[MAX_LEAVES][8];
    for (Py_ssize_t i = 0; i < spec->nleaves; i++) {
        const LeafSpec *leaf = &spec->leaves[i];
        PyObject *obj = args[3 + i];
        data[i] = leaf->ndim < 0 ? scalar_bytes(leaf, obj, scratch[i]) : array_bytes(leaf, obj);
        if (data[i] == NULL) return PyLong_FromLong(NOT_TAKEN);
        if (outside(leaf, data[i])) return PyLong_FromSsize_t(i + 1);
    }
    char *row = PyArray_BYTES(rows) + r * spec->nbytes;
    for (Py_ssize_t i = 0; i < spec->nleaves; i++) {
        const LeafSpec *leaf = &spec->leaves[i];
        memmove(row + leaf->offset, data[i], (size_t)(leaf->size * leaf->itemsize));  /* a leaf may view the row */
    }
    for (Py_ssize_t g = 0; g < spec->ngaps; g++)
        memset(row + spec->gaps[2 * g], 0, (size_t)(spec->gaps[2 * g + 1] - spec->gaps[2 * g]));
    return PyLong_FromLong(0);
}

static PyMethodDef methods[] = {
    {"make_spec", make_spec, METH_VARARGS,
     "make_spec(nbytes, gaps, leaves) -> spec: what pack checks and where it writes.\n\n"
     "leaves: one (kind, itemsize, shape or None, offset, lo, hi, scalar_type, takes_int) per argument."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(spec, rows, r, *leaves) -> 0 (written), k > 0 (leaf k - 1 out of bounds) or -1 (not taken)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpack", "Check and copy a sample's leaves into a packed row.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__fastpack(void) {
    import_array();
    return PyModule_Create(&module);
}
