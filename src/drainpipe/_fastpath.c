/* drainpipe._fastpath: the per-item hot paths of BatchQueue, in C.
 *
 * Why C: a produce written in Python costs ~200 ns of interpreter work per item (a Python call, a dict lookup,
 * a bound check, an append, a counter), and grouping drained items by type another ~80 ns; the GIL serialises all
 * of it. Here the same steps cost a few tens of ns. Everything that is not per item (blocking waits, shutdown
 * races, growth, rebalancing, dispatch) stays in Python.
 *
 * Concurrency rule this module relies on (CPython with the GIL; not free-threaded builds): a C function that runs
 * no Python code and allocates no GC-tracked object cannot be interrupted by another Python thread. So
 *   - Buffers.put, Producer.__call__ and Producer.many check the closing flag, read a partition's list, check its
 *     bound and append to it atomically: they look the list up only after routing (which may run Python code: a
 *     selector, a metaclass __hash__) and append with PyList_Append, which only reallocates memory. An item is
 *     therefore either appended before shutdown set the flag (and the final drain, which runs after that, takes
 *     it) or refused: no append can race with the final drain;
 *   - Buffers.take allocates the empty replacement list first (an allocation may run the GC and so other threads),
 *     then swaps it in without anything in between, so the drain takes a whole partition in O(1) and no appended
 *     item can land in a list that was already taken;
 *   - the per-partition produced counters are plain C integers bumped inside those same atomic sections: exact,
 *     without a lock.
 *
 * Buffer lists are not tracked by the cyclic GC while they sit in the queue (they are tracked again when take
 * hands them out): a young list of thousands of items would otherwise be traversed by every young-generation
 * collection, which cost more than the append itself. Objects they hold are still collected normally (an
 * untracked container only makes the GC more conservative: what it references is considered reachable).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* ------------------------------------------------------------------------------------------------- Buffers */

typedef struct {
    PyObject_HEAD
    PyObject *lists;          /* list of lists: one buffer per partition, replaced on take */
    PyObject *closing;        /* list [bool]: closing[0] is True once shutdown began; nothing is appended then */
    long long *counts;        /* items accepted per partition (monotonic) */
    Py_ssize_t alloc;         /* capacity of counts */
    Py_ssize_t cap;           /* buffer_size: the bound of every partition */
} BuffersObject;

static PyTypeObject BuffersType;

static int
buffers_index(BuffersObject *self, Py_ssize_t p)
{
    if (p < 0 || p >= PyList_GET_SIZE(self->lists)) {
        PyErr_Format(PyExc_IndexError, "partition %zd out of range (%zd partitions)", p,
                     PyList_GET_SIZE(self->lists));
        return -1;
    }
    return 0;
}

/* A partition number given from Python: 0 and *p set, or -1 with an exception. */
static int
partition_arg(BuffersObject *self, PyObject *arg, Py_ssize_t *p)
{
    *p = PyLong_AsSsize_t(arg);
    if (*p == -1 && PyErr_Occurred())
        return -1;
    return buffers_index(self, *p);
}

static long long
partition_size(BuffersObject *self, Py_ssize_t p)
{
    return PyList_GET_SIZE(PyList_GET_ITEM(self->lists, p));
}

static long long
partition_produced(BuffersObject *self, Py_ssize_t p)
{
    return self->counts[p];
}

/* A tuple of value(self, p) for every partition, made in one atomic step (a consistent snapshot). */
static PyObject *
per_partition(BuffersObject *self, long long (*value)(BuffersObject *, Py_ssize_t))
{
    Py_ssize_t n = PyList_GET_SIZE(self->lists);
    long long *values = PyMem_Malloc((n ? n : 1) * sizeof(long long));
    if (values == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t p = 0; p < n; p++)      /* read everything before allocating Python objects (GC) */
        values[p] = value(self, p);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t p = 0; out != NULL && p < n; p++) {
        PyObject *v = PyLong_FromLongLong(values[p]);
        if (v == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, p, v);
    }
    PyMem_Free(values);
    return out;
}

static int
buffers_grow_one(BuffersObject *self)
{
    Py_ssize_t n = PyList_GET_SIZE(self->lists);
    if (n >= self->alloc) {
        Py_ssize_t alloc = self->alloc ? self->alloc * 2 : 8;
        long long *counts = PyMem_Realloc(self->counts, alloc * sizeof(long long));
        if (counts == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->counts = counts;
        self->alloc = alloc;
    }
    PyObject *buf = PyList_New(0);
    if (buf == NULL)
        return -1;
    PyObject_GC_UnTrack(buf);
    self->counts[n] = 0;
    int rc = PyList_Append(self->lists, buf);   /* publishes the partition: its counter is ready */
    Py_DECREF(buf);
    return rc;
}

static int
buffers_init(BuffersObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"partitions", "capacity", "closing", NULL};
    Py_ssize_t partitions, cap;
    PyObject *closing;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nnO!:Buffers", kwlist, &partitions, &cap, &PyList_Type, &closing))
        return -1;
    if (partitions < 1 || cap < 1 || PyList_GET_SIZE(closing) != 1) {
        PyErr_SetString(PyExc_ValueError, "partitions and capacity must be >= 1, closing a one-element list");
        return -1;
    }
    if (self->lists != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Buffers is already initialised");
        return -1;
    }
    self->lists = PyList_New(0);
    if (self->lists == NULL)
        return -1;
    self->cap = cap;
    self->closing = Py_NewRef(closing);
    for (Py_ssize_t i = 0; i < partitions; i++)
        if (buffers_grow_one(self) < 0)
            return -1;
    return 0;
}

static int
buffers_traverse(BuffersObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->lists);
    Py_VISIT(self->closing);
    return 0;
}

static int
buffers_clear(BuffersObject *self)
{
    Py_CLEAR(self->lists);
    Py_CLEAR(self->closing);
    return 0;
}

static void
buffers_dealloc(BuffersObject *self)
{
    PyObject_GC_UnTrack(self);
    buffers_clear(self);
    PyMem_Free(self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline int
is_closing(BuffersObject *self)
{
    return PyList_GET_ITEM(self->closing, 0) == Py_True;
}

/* Append one item to partition p if it is open and has room: 1 appended (and counted), 2 appended as the first
 * item of an empty partition, 0 full or closing, -1 error. Atomic: see the module docstring. */
static inline int
buffers_append(BuffersObject *self, Py_ssize_t p, PyObject *item)
{
    PyObject *buf = PyList_GET_ITEM(self->lists, p);
    Py_ssize_t size = PyList_GET_SIZE(buf);
    if (size >= self->cap || is_closing(self))
        return 0;
    if (PyList_Append(buf, item) < 0)
        return -1;
    self->counts[p]++;
    return size == 0 ? 2 : 1;
}

/* Append items[start:] to partition p while there is room and shutdown has not begun; count them. */
static Py_ssize_t
buffers_put_impl(BuffersObject *self, Py_ssize_t p, PyObject *items, Py_ssize_t start)
{
    if (is_closing(self))
        return 0;
    PyObject *buf = PyList_GET_ITEM(self->lists, p);
    Py_ssize_t room = self->cap - PyList_GET_SIZE(buf);
    Py_ssize_t k = PyList_GET_SIZE(items) - start;
    if (k > room)
        k = room;
    if (k <= 0)
        return 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (PyList_Append(buf, PyList_GET_ITEM(items, start + i)) < 0) {
            self->counts[p] += i;
            return -1;
        }
    }
    self->counts[p] += k;
    return k;
}

static PyObject *
buffers_put(BuffersObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "put(partition, items: list, start=0)");
        return NULL;
    }
    Py_ssize_t p, start = 0;
    if (partition_arg(self, args[0], &p) < 0)
        return NULL;
    if (nargs == 3) {
        start = PyLong_AsSsize_t(args[2]);
        if (start == -1 && PyErr_Occurred())
            return NULL;
        if (start < 0 || start > PyList_GET_SIZE(args[1])) {
            PyErr_SetString(PyExc_ValueError, "start out of range");
            return NULL;
        }
    }
    Py_ssize_t k = buffers_put_impl(self, p, args[1], start);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

static PyObject *
buffers_take(BuffersObject *self, PyObject *arg)
{
    Py_ssize_t p;
    if (partition_arg(self, arg, &p) < 0)
        return NULL;
    if (PyList_GET_SIZE(PyList_GET_ITEM(self->lists, p)) == 0)
        Py_RETURN_NONE;
    PyObject *fresh = PyList_New(0);     /* may run the GC (and other threads): before the swap, not inside it */
    if (fresh == NULL)
        return NULL;
    PyObject_GC_UnTrack(fresh);
    PyObject *taken = PyList_GET_ITEM(self->lists, p);
    PyList_SET_ITEM(self->lists, p, fresh);   /* our reference to taken moves to the caller */
    if (!PyObject_GC_IsTracked(taken))
        PyObject_GC_Track(taken);             /* a batch in user hands is an ordinary list again */
    return taken;
}

static PyObject *
buffers_size(BuffersObject *self, PyObject *arg)
{
    Py_ssize_t p;
    return partition_arg(self, arg, &p) < 0 ? NULL : PyLong_FromLongLong(partition_size(self, p));
}

static PyObject *
buffers_sizes(BuffersObject *self, PyObject *Py_UNUSED(ignored))
{
    return per_partition(self, partition_size);
}

static PyObject *
buffers_produced(BuffersObject *self, PyObject *arg)
{
    Py_ssize_t p;
    return partition_arg(self, arg, &p) < 0 ? NULL : PyLong_FromLongLong(partition_produced(self, p));
}

static PyObject *
buffers_produced_all(BuffersObject *self, PyObject *Py_UNUSED(ignored))
{
    return per_partition(self, partition_produced);
}

static PyObject *
buffers_grow(BuffersObject *self, PyObject *Py_UNUSED(ignored))
{
    if (buffers_grow_one(self) < 0)
        return NULL;
    return PyLong_FromSsize_t(PyList_GET_SIZE(self->lists));
}

static Py_ssize_t
buffers_len(BuffersObject *self)
{
    return PyList_GET_SIZE(self->lists);
}

static PyObject *
buffers_get_capacity(BuffersObject *self, void *closure)
{
    return PyLong_FromSsize_t(self->cap);
}

static PyMethodDef buffers_methods[] = {
    {"put", (PyCFunction)(void (*)(void))buffers_put, METH_FASTCALL,
     "put(p, items: list, start=0) -> int: append items[start:] to partition p while it has room and shutdown"
     " has not begun (atomically), count them, return how many went in."},
    {"take", (PyCFunction)buffers_take, METH_O,
     "take(p) -> list | None: every item of partition p, swapped out for an empty list in O(1); None if empty."},
    {"size", (PyCFunction)buffers_size, METH_O, "size(p) -> int: items buffered in partition p."},
    {"sizes", (PyCFunction)buffers_sizes, METH_NOARGS, "sizes() -> tuple: items buffered per partition."},
    {"produced", (PyCFunction)buffers_produced, METH_O, "produced(p) -> int: items ever accepted into p."},
    {"produced_all", (PyCFunction)buffers_produced_all, METH_NOARGS,
     "produced_all() -> tuple: items ever accepted, per partition (one consistent snapshot)."},
    {"grow", (PyCFunction)buffers_grow, METH_NOARGS, "grow() -> int: add one empty partition; the new count."},
    {NULL}
};

static PyGetSetDef buffers_getset[] = {
    {"capacity", (getter)buffers_get_capacity, NULL, "the bound of every partition", NULL},
    {NULL}
};

static PySequenceMethods buffers_as_sequence = {
    .sq_length = (lenfunc)buffers_len,
};

static PyTypeObject BuffersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "drainpipe._fastpath.Buffers",
    .tp_doc = PyDoc_STR(
        "Buffers(partitions, capacity, closing): a queue's bounded partition buffers and produced counters.\n\n"
        "Every method is atomic with respect to other Python threads (see the module docstring)."),
    .tp_basicsize = sizeof(BuffersObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)buffers_init,
    .tp_dealloc = (destructor)buffers_dealloc,
    .tp_traverse = (traverseproc)buffers_traverse,
    .tp_clear = (inquiry)buffers_clear,
    .tp_methods = buffers_methods,
    .tp_getset = buffers_getset,
    .tp_as_sequence = &buffers_as_sequence,
};

/* ------------------------------------------------------------------------------------------------ Producer */

#define ROUTE_CACHE 2048

static inline size_t
cache_slot(PyTypeObject *t)
{
    size_t h = (size_t)t >> 4;     /* objects are 16-byte aligned */
    return (h ^ (h >> 8)) & (ROUTE_CACHE - 1);
}

typedef struct {
    PyObject_HEAD
    BuffersObject *buffers;
    PyObject *routes;         /* dict type -> partition (type_hash routing), or NULL */
    PyObject *select;         /* selector(item, n) -> partition (any other routing), or NULL */
    PyObject *pcount;         /* list [int]: the published partition count, for the selector */
    PyObject *route_slow;     /* (item) -> partition | None: types the route table lacks (None: dropped) */
    PyObject *full;           /* (item, p) -> bool: partition p was full (drop, or wait for room) */
    vectorcallfunc vectorcall;
    /* A direct-mapped cache of routes hits (type -> partition): a dict lookup keyed by a type costs several times
     * the rest of a produce. Entries are valid while their type is in routes (which keeps it alive); every change
     * of routes goes through set_route/drop_route, which empty the cache in the same atomic step. */
    PyTypeObject *cache_type[ROUTE_CACHE];
    Py_ssize_t cache_p[ROUTE_CACHE];
    /* cold: read only when an item lands in an empty partition */
    PyObject *wake;           /* (p) -> None: the item just put made partition p non-empty, or NULL */
    PyObject *owners;         /* list: owner task of each partition (-1: none), grown in place; with wake */
    PyObject *idle;           /* list: per task, True while it backs off idle; with wake */
} ProducerObject;

static PyTypeObject ProducerType;

static int
as_partition(PyObject *v, Py_ssize_t *out)
{
    Py_ssize_t p = PyLong_AsSsize_t(v);
    if (p == -1 && PyErr_Occurred())
        return -1;
    *out = p;
    return 0;
}

/* Route one item: 1 and *out = partition, 0 = dropped for want of a handler (counted by route_slow), -1 error.
 * *table tells whether the route table answered (then every item of that type routes the same way).
 * May run Python code, so callers look up the partition's buffer only afterwards. */
static int
route_item(ProducerObject *self, PyObject *item, Py_ssize_t *out, int *table)
{
    *table = 0;
    if (self->routes != NULL) {
        PyTypeObject *t = Py_TYPE(item);
        size_t slot = cache_slot(t);
        if (self->cache_type[slot] == t) {
            *table = 1;
            *out = self->cache_p[slot];
            return 1;
        }
        PyObject *v = PyDict_GetItemWithError(self->routes, (PyObject *)t);
        if (v != NULL) {
            if (as_partition(v, out) < 0)
                return -1;
            *table = 1;
            self->cache_type[slot] = t;
            self->cache_p[slot] = *out;
            return 1;
        }
        if (PyErr_Occurred())
            return -1;
        PyObject *r = PyObject_CallOneArg(self->route_slow, item);
        if (r == NULL)
            return -1;
        if (r == Py_None) {
            Py_DECREF(r);
            return 0;
        }
        int rc = as_partition(r, out);
        Py_DECREF(r);
        return rc < 0 ? -1 : 1;
    }
    PyObject *nobj = PyList_GET_ITEM(self->pcount, 0);
    Py_ssize_t n = PyLong_AsSsize_t(nobj);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n <= 1) {
        *out = 0;
        return 1;
    }
    Py_INCREF(nobj);
    PyObject *args[2] = {item, nobj};
    PyObject *r = PyObject_Vectorcall(self->select, args, 2, NULL);
    Py_DECREF(nobj);
    if (r == NULL)
        return -1;
    Py_ssize_t p = -1;
    if (PyLong_Check(r))
        p = PyLong_AsSsize_t(r);
    if (p == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (p < 0 || p >= n) {
        PyErr_Format(PyExc_ValueError, "partition selector returned %R for %zd partitions", r, n);
        Py_DECREF(r);
        return -1;
    }
    Py_DECREF(r);
    *out = p;
    return 1;
}

/* After the first item went into the empty partition p (its owner may be asleep in backoff): call wake(p) if the
 * owner backs off idle. A failing wake must not fail a produce that has already happened: it is reported as
 * unraisable. Returns 1 if it called wake (Python ran: the routes may have changed meanwhile), else 0. */
static int
maybe_wake(ProducerObject *self, Py_ssize_t p)
{
    if (self->wake == NULL)
        return 0;
    /* only an owner that backs off idle needs waking: the common case (a busy owner) costs two list reads */
    if (p >= PyList_GET_SIZE(self->owners))
        return 0;
    Py_ssize_t t = PyLong_AsSsize_t(PyList_GET_ITEM(self->owners, p));
    if (t < 0 || t >= PyList_GET_SIZE(self->idle)) {
        PyErr_Clear();
        return 0;
    }
    if (PyList_GET_ITEM(self->idle, t) != Py_True)
        return 0;
    PyObject *pobj = PyLong_FromSsize_t(p);
    PyObject *r = pobj == NULL ? NULL : PyObject_CallOneArg(self->wake, pobj);
    Py_XDECREF(pobj);
    if (r == NULL)
        PyErr_WriteUnraisable(self->wake);
    Py_XDECREF(r);
    return 1;
}

static PyObject *
producer_vectorcall(ProducerObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "produce(item) takes exactly one positional argument");
        return NULL;
    }
    PyObject *item = args[0];
    BuffersObject *b = self->buffers;
    if (is_closing(b))
        Py_RETURN_FALSE;
    Py_ssize_t p;
    int table;
    int r = route_item(self, item, &p, &table);
    if (r < 0)
        return NULL;
    if (r == 0)
        Py_RETURN_TRUE;          /* accepted and dropped for want of a handler (counted, logged once) */
    if (buffers_index(b, p) < 0)
        return NULL;
    int done = buffers_append(b, p, item);
    if (done < 0)
        return NULL;
    if (done == 2)
        maybe_wake(self, p);
    if (done)
        Py_RETURN_TRUE;
    if (is_closing(b))
        Py_RETURN_FALSE;
    PyObject *pobj = PyLong_FromSsize_t(p);
    if (pobj == NULL)
        return NULL;
    PyObject *fargs[2] = {item, pobj};
    PyObject *res = PyObject_Vectorcall(self->full, fargs, 2, NULL);
    Py_DECREF(pobj);
    return res;
}

/* State of one many() call. */
typedef struct {
    Py_ssize_t accepted;
    PyObject *overflow;             /* dict p -> list, created on the first full partition */
    PyTypeObject *last_type;        /* runs of one type: one route lookup per run */
    Py_ssize_t last_p;
} ManyState;

/* One item of many(): 1 go on, 0 stop (shutdown began), -1 error. */
static int
many_one(ProducerObject *self, ManyState *st, PyObject *item)
{
    BuffersObject *b = self->buffers;
    Py_ssize_t p;
    if (Py_TYPE(item) == st->last_type) {
        p = st->last_p;
    }
    else {
        int table;
        int r = route_item(self, item, &p, &table);
        if (r < 0)
            return -1;
        if (r == 0) {
            st->accepted++;                   /* accepted and dropped for want of a handler */
            st->last_type = NULL;
            return 1;
        }
        if (buffers_index(b, p) < 0)
            return -1;
        /* a route table hit holds for the rest of the run; a slow route (split types, round-robin) does not */
        st->last_type = table ? Py_TYPE(item) : NULL;
        st->last_p = p;
    }
    PyObject *pending = NULL;
    if (st->overflow != NULL) {
        PyObject *key = PyLong_FromSsize_t(p);
        if (key == NULL)
            return -1;
        pending = PyDict_GetItemWithError(st->overflow, key);
        Py_DECREF(key);
        if (pending == NULL && PyErr_Occurred())
            return -1;
    }
    if (pending == NULL) {                    /* partition p has not overflowed in this call */
        int r = buffers_append(b, p, item);
        if (r != 0) {
            if (r > 0) {
                st->accepted++;
                if (r == 2 && maybe_wake(self, p))
                    st->last_type = NULL; /* Python ran: a shrink may have moved this type (set_route) */
            }
            return r < 0 ? -1 : 1;
        }
        if (is_closing(b))
            return 0;
        if (st->overflow == NULL && (st->overflow = PyDict_New()) == NULL)
            return -1;
        PyObject *key = PyLong_FromSsize_t(p);
        if (key == NULL)
            return -1;
        pending = PyList_New(0);
        int bad = pending == NULL || PyDict_SetItem(st->overflow, key, pending) < 0;
        Py_DECREF(key);
        Py_XDECREF(pending);                  /* kept alive by overflow */
        if (bad)
            return -1;
    }
    return PyList_Append(pending, item) < 0 ? -1 : 1;
}

/* many(items: list) -> (accepted, overflow): produce every item in order, as a call would, but without a Python
 * call per item. Items whose partition is full go to overflow (dict partition -> list, or None), and so do all
 * later items of that partition in this call, to keep their order; the caller drops or waits for them. Stops at
 * shutdown: accepted counts what went in (and items dropped at once for want of a handler). */
static PyObject *
producer_many(ProducerObject *self, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "many needs a list");
        return NULL;
    }
    ManyState st = {0, NULL, NULL, -1};
    int r = 1;
    /* Routing may run Python code (a selector, route_slow) that could change the caller's list: hold the list
     * and the item being produced, and read the bound again on every step. */
    Py_INCREF(items);
    for (Py_ssize_t i = 0; r > 0 && i < PyList_GET_SIZE(items); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(items, i));
        r = many_one(self, &st, item);
        Py_DECREF(item);
    }
    Py_DECREF(items);
    PyObject *result = r < 0 ? NULL : Py_BuildValue("(nO)", st.accepted, st.overflow ? st.overflow : Py_None);
    Py_XDECREF(st.overflow);
    return result;
}

static void
forget_routes(ProducerObject *self)
{
    memset(self->cache_type, 0, sizeof(self->cache_type));
}

static PyObject *
producer_set_route(ProducerObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyLong_Check(args[1]) || self->routes == NULL) {
        PyErr_SetString(PyExc_TypeError, "set_route(type, partition) on a type-routing producer");
        return NULL;
    }
    forget_routes(self);
    if (PyDict_SetItem(self->routes, args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
producer_drop_route(ProducerObject *self, PyObject *type)
{
    if (!PyType_Check(type) || self->routes == NULL) {
        PyErr_SetString(PyExc_TypeError, "drop_route(type) on a type-routing producer");
        return NULL;
    }
    forget_routes(self);
    PyObject *old = NULL;
    if (PyDict_GetItemWithError(self->routes, type) != NULL) {
        old = Py_NewRef(type);                 /* keep the key alive until the cache is empty and the entry gone */
        if (PyDict_DelItem(self->routes, type) < 0) {
            Py_DECREF(old);
            return NULL;
        }
    }
    else if (PyErr_Occurred())
        return NULL;
    if (old == NULL)
        Py_RETURN_FALSE;
    Py_DECREF(old);
    Py_RETURN_TRUE;
}

static int
producer_init(ProducerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffers", "routes", "select", "pcount", "route_slow", "full", "wake", "owners", "idle",
                             NULL};
    PyObject *buffers, *routes, *select, *pcount, *route_slow, *full, *wake = Py_None, *owners = Py_None,
             *idle = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!OO|OOO:Producer", kwlist, &BuffersType, &buffers,
                                     &routes, &select, &PyList_Type, &pcount, &route_slow, &full, &wake, &owners,
                                     &idle))
        return -1;
    if (wake != Py_None && (!PyCallable_Check(wake) || !PyList_Check(owners) || !PyList_Check(idle))) {
        PyErr_SetString(PyExc_TypeError, "wake must be callable, with owners and idle lists");
        return -1;
    }
    if (PyList_GET_SIZE(pcount) != 1) {
        PyErr_SetString(PyExc_ValueError, "pcount must be a one-element list");
        return -1;
    }
    if ((routes == Py_None) == (select == Py_None) || (routes != Py_None && !PyDict_CheckExact(routes))) {
        PyErr_SetString(PyExc_TypeError, "give exactly one of routes (a dict) and select (a callable)");
        return -1;
    }
    if (!PyCallable_Check(route_slow) || !PyCallable_Check(full) || (select != Py_None && !PyCallable_Check(select))) {
        PyErr_SetString(PyExc_TypeError, "select, route_slow and full must be callable");
        return -1;
    }
    Py_XSETREF(self->buffers, (BuffersObject *)Py_NewRef(buffers));
    Py_XSETREF(self->routes, routes == Py_None ? NULL : Py_NewRef(routes));
    Py_XSETREF(self->select, select == Py_None ? NULL : Py_NewRef(select));
    Py_XSETREF(self->pcount, Py_NewRef(pcount));
    Py_XSETREF(self->route_slow, Py_NewRef(route_slow));
    Py_XSETREF(self->full, Py_NewRef(full));
    Py_XSETREF(self->wake, wake == Py_None ? NULL : Py_NewRef(wake));
    Py_XSETREF(self->owners, wake == Py_None ? NULL : Py_NewRef(owners));
    Py_XSETREF(self->idle, wake == Py_None ? NULL : Py_NewRef(idle));
    forget_routes(self);
    self->vectorcall = (vectorcallfunc)producer_vectorcall;
    return 0;
}

static PyObject *
producer_call(ProducerObject *self, PyObject *args, PyObject *kwds)
{
    if (self->buffers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Producer is not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwds);
}

static int
producer_traverse(ProducerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buffers);
    Py_VISIT(self->routes);
    Py_VISIT(self->select);
    Py_VISIT(self->pcount);
    Py_VISIT(self->route_slow);
    Py_VISIT(self->full);
    Py_VISIT(self->wake);
    Py_VISIT(self->owners);
    Py_VISIT(self->idle);
    return 0;
}

static int
producer_clear(ProducerObject *self)
{
    Py_CLEAR(self->buffers);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->select);
    Py_CLEAR(self->pcount);
    Py_CLEAR(self->route_slow);
    Py_CLEAR(self->full);
    Py_CLEAR(self->wake);
    Py_CLEAR(self->owners);
    Py_CLEAR(self->idle);
    return 0;
}

static void
producer_dealloc(ProducerObject *self)
{
    PyObject_GC_UnTrack(self);
    producer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
producer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ProducerObject *self = (ProducerObject *)PyType_GenericNew(type, args, kwds);
    if (self != NULL)
        self->vectorcall = NULL;   /* until __init__ ran: tp_call checks buffers */
    return (PyObject *)self;
}

static PyMethodDef producer_methods[] = {
    {"set_route", (PyCFunction)(void (*)(void))producer_set_route, METH_FASTCALL,
     "set_route(type, partition): route items of exactly type to partition (the only way to change routes)."},
    {"drop_route", (PyCFunction)producer_drop_route, METH_O,
     "drop_route(type) -> bool: stop routing type through the route table; True if it was there."},
    {"many", (PyCFunction)producer_many, METH_O,
     "many(items: list) -> (accepted, overflow): produce each item in order as a call would; items that found"
     " their partition full (and that partition's later items) come back in overflow, a dict partition -> list"
     " (None if there were none), for the caller to drop or wait for. Stops at shutdown."},
    {NULL}
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "drainpipe._fastpath.Producer",
    .tp_doc = PyDoc_STR(
        "produce(item) -> bool: put item into its partition. False after shutdown began, or (IF_POSSIBLE) when\n"
        "its partition is full; with BLOCKING it waits for room. Thread-safe and lock-free on the common path."),
    .tp_basicsize = sizeof(ProducerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(ProducerObject, vectorcall),
    .tp_call = (ternaryfunc)producer_call,
    .tp_new = producer_new,
    .tp_init = (initproc)producer_init,
    .tp_dealloc = (destructor)producer_dealloc,
    .tp_traverse = (traverseproc)producer_traverse,
    .tp_clear = (inquiry)producer_clear,
    .tp_methods = producer_methods,
};

/* -------------------------------------------------------------------------------------------- group_by_type */

#define GROUP_SCAN 8

/* group_by_type(items: list) -> list of (type, list): items by exact type, first-seen order, order kept within a
 * type. A homogeneous batch is returned as [(type, items)] without a copy. */
static PyObject *
group_by_type(PyObject *module, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "group_by_type needs a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n == 0)
        return PyList_New(0);
    PyTypeObject *first = Py_TYPE(PyList_GET_ITEM(items, 0));
    Py_ssize_t i = 1;
    while (i < n && Py_TYPE(PyList_GET_ITEM(items, i)) == first)
        i++;
    if (i == n)
        return Py_BuildValue("[(OO)]", (PyObject *)first, items);

    /* The few types of a partition are found by a linear scan of the groups seen so far; a dict index takes
     * over past GROUP_SCAN types. */
    PyObject *order = PyList_New(0);     /* (type, list) in first-seen order */
    PyObject *index = NULL;              /* type -> its list, once there are many types */
    PyTypeObject *seen_type[GROUP_SCAN];
    PyObject *seen_list[GROUP_SCAN];     /* borrowed: order keeps them alive */
    Py_ssize_t nseen = 0;
    if (order == NULL)
        return NULL;
    Py_INCREF(items);
    PyTypeObject *last_type = NULL;
    PyObject *last = NULL;
    for (i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyTypeObject *t = Py_TYPE(item);
        if (t != last_type) {
            last = NULL;
            if (index == NULL) {
                for (Py_ssize_t j = 0; j < nseen; j++)
                    if (seen_type[j] == t) {
                        last = seen_list[j];
                        break;
                    }
            }
            else {
                last = PyDict_GetItemWithError(index, (PyObject *)t);
                if (last == NULL && PyErr_Occurred())
                    goto error;
            }
            if (last == NULL) {
                PyObject *fresh = PyList_New(0);
                if (fresh == NULL)
                    goto error;
                PyObject *pair = PyTuple_Pack(2, (PyObject *)t, fresh);
                int bad = pair == NULL || PyList_Append(order, pair) < 0;
                Py_XDECREF(pair);
                Py_DECREF(fresh);
                if (bad)
                    goto error;
                last = fresh;            /* kept alive by order */
                if (index == NULL && nseen < GROUP_SCAN) {
                    seen_type[nseen] = t;
                    seen_list[nseen++] = fresh;
                }
                else {
                    if (index == NULL) {     /* too many types to scan: index them all */
                        if ((index = PyDict_New()) == NULL)
                            goto error;
                        for (Py_ssize_t j = 0; j < nseen; j++)
                            if (PyDict_SetItem(index, (PyObject *)seen_type[j], seen_list[j]) < 0)
                                goto error;
                    }
                    if (PyDict_SetItem(index, (PyObject *)t, fresh) < 0)
                        goto error;
                }
            }
            last_type = t;
        }
        if (PyList_Append(last, item) < 0)
            goto error;
    }
    Py_DECREF(items);
    Py_XDECREF(index);
    return order;
error:
    Py_DECREF(items);
    Py_XDECREF(index);
    Py_DECREF(order);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"group_by_type", (PyCFunction)group_by_type, METH_O,
     "group_by_type(items: list) -> list of (type, list): items by exact type, in first-seen order."},
    {NULL}
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "drainpipe._fastpath",
    .m_doc = "The per-item hot paths of BatchQueue (produce, bounded append, take, group by type), in C.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if (PyType_Ready(&BuffersType) < 0 || PyType_Ready(&ProducerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Buffers", (PyObject *)&BuffersType) < 0 ||
        PyModule_AddObjectRef(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
