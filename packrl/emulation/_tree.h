/* What _fastpack.c and _fastaction.c share: the layout tree they walk, and the shapes of their specs' entries.
   The layout tree: a node is a leaf index (an int) or (keys, children):
   keys is a tuple of one key per child for a Dict node, None for a Tuple node. check_tree checks that shape once,
   when a spec is made, and hands each leaf index, in order, to on_leaf, which sets the error and returns -1 to
   refuse it. */
#ifndef PACKRL_TREE_H
#define PACKRL_TREE_H

#include <Python.h>

typedef int (*tree_leaf_check)(Py_ssize_t index, void *context);

static int check_tree(PyObject *node, tree_leaf_check on_leaf, void *context) {
    if (PyLong_CheckExact(node)) {
        Py_ssize_t i = PyLong_AsSsize_t(node);
        if (i == -1 && PyErr_Occurred()) return -1;
        return on_leaf(i, context);
    }
    if (!PyTuple_CheckExact(node) || PyTuple_GET_SIZE(node) != 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(node, 1))) {
        PyErr_SetString(PyExc_ValueError, "a tree node is a leaf index or (keys or None, children)");
        return -1;
    }
    PyObject *keys = PyTuple_GET_ITEM(node, 0), *children = PyTuple_GET_ITEM(node, 1);
    if (keys != Py_None && (!PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(children))) {
        PyErr_SetString(PyExc_ValueError, "a Dict node needs one key per child");
        return -1;
    }
    if (Py_EnterRecursiveCall(" in a packrl layout tree")) return -1;
    int status = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(children) && status == 0; k++)
        status = check_tree(PyTuple_GET_ITEM(children, k), on_leaf, context);
    Py_LeaveRecursiveCall();
    return status;
}

/* A spec's shape tuple into dims (npy_intp[NPY_MAXDIMS]: include numpy's header first) with its ndim and element
   count; -1 with the error set for more than NPY_MAXDIMS dimensions or a negative one. */
static int parse_shape(PyObject *shape, npy_intp *dims, int *ndim, npy_intp *size) {
    if (PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError, "a shape has at most NPY_MAXDIMS dimensions");
        return -1;
    }
    *ndim = (int)PyTuple_GET_SIZE(shape);
    *size = 1;
    for (int d = 0; d < *ndim; d++) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dims[d] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative dimension");
            return -1;
        }
        *size *= dims[d];
    }
    return 0;
}

#endif
