/* The layout tree that _fastpack.c and _fastaction.c walk. A node is a leaf index (an int) or (keys, children):
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

#endif
