/* The detector's step in one call (band.c), a function of the _monstats module. */
#ifndef OPSCOPE_MONITOR_BAND_H
#define OPSCOPE_MONITOR_BAND_H
#include <Python.h>

PyObject *band_update(PyObject *self, PyObject *args);

#endif
