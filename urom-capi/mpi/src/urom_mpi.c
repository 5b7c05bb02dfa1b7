/*
 * urom_mpi.c - MPI's collectives offloaded to urom through the MPI profiling interface.
 *
 * Loaded before libmpi (LD_PRELOAD), this file's MPI_* functions run instead of the MPI
 * library's, hand what urom can do to the node's urom worker through urom_coll.h, and pass the
 * rest to PMPI_* untouched. Layers, top down:
 *
 *   MPI_Init / MPI_Init_thread   PMPI_Init*, then a urom_coll context over the node's ranks
 *                                (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)); its first rank
 *                                starts the node's worker, the others attach.
 *   communicators                a team per communicator, formed lazily by its first
 *                                collective, kept in an attribute whose delete callback
 *                                destroys it (MPI_Comm_free, MPI_Finalize).
 *   collectives                  (datatype, op, communicator) mapped to a urom collective, or
 *                                PMPI_* with the reason noted (UROM_MPI_VERBOSE=1 prints it).
 *   buffers                      user memory registered by address (cross-memory attach),
 *                                cached per (address, length) and communicator.
 *   set-up collectives           a non-blocking or blocking call reuses a collective set up on
 *                                the worker before by a call of the same signature on the same
 *                                communicator (a per-communicator cache that every rank walks
 *                                the same way: its key is what MPI requires to match); this
 *                                rank's buffers, if they changed, are rebound alone.
 *   persistent collectives       MPIX_*_init sets the collective up once, buffers registered
 *                                once; MPI_Start(all) starts it; its MPI_Request is an inactive
 *                                persistent request of Open MPI's (a receive from
 *                                MPI_PROC_NULL) that the completion calls recognise.
 *   requests                     generalized requests (MPI_Grequest_start) completed by a
 *                                progress hook that runs in every call intercepted here,
 *                                including MPI_Wait/Test/Waitall/Testall/Waitany/Testany/
 *                                Waitsome/Testsome, which also carry a failed collective's
 *                                MPI_ERR_OTHER to the program through the communicator's
 *                                error handler.
 *
 * Every decision that changes what the ranks of a communicator do is the same on all of them:
 * it depends only on the call's arguments (which MPI requires to match), on the environment,
 * or on values agreed with PMPI_Allreduce when the communicator's team forms.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI's extensions: the persistent collectives (pcollreq) */
#endif
#endif
#include <urom_coll.h>

/* Open MPI 4.1's persistent collectives (MPIX_*_init); MPI 4.0's MPI_*_init are the same calls
 * under their standard names. */
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define UROM_MPI_PCOLL 1
#else
#define UROM_MPI_PCOLL 0
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_TEAM 64
#define MAX_REGS 64
#define MAX_NOTES 256
#define CACHE_KEYS 32  /* call signatures whose set-up collectives a communicator keeps */
#define MAX_DEPTH 16   /* set-up collectives per signature, at most */

/* ---------------------------------------------------------------------------------------- */
/* Settings, and what UROM_MPI_VERBOSE prints. */

static int g_ready;                 /* MPI_Init ran here */
static int g_verbose;
static int g_rank;                  /* in MPI_COMM_WORLD */
static const char *g_off;           /* why nothing is offloaded on this rank, or NULL */
static char g_off_buf[512];
static int g_worker_dead;           /* the node's worker died: everything falls back */
static urom_coll_context_h g_ctx;
static int g_depth = 4; /* set-up collectives kept per call signature; 0: none kept */
static MPI_Comm g_node = MPI_COMM_NULL;
static int g_keyval = MPI_KEYVAL_INVALID;

static struct {
	const char *call, *what, *why;
} g_notes[MAX_NOTES];
static int g_nnotes;

/* Prints, once per rank and (call, outcome, reason), what happened to a call. */
static void note(const char *call, const char *what, const char *why)
{
	int i;

	if (!g_verbose)
		return;
	for (i = 0; i < g_nnotes; i++)
		if (g_notes[i].call == call && g_notes[i].what == what &&
		    (g_notes[i].why == why || (why && g_notes[i].why && !strcmp(g_notes[i].why, why))))
			return;
	if (g_nnotes < MAX_NOTES) {
		g_notes[g_nnotes].call = call;
		g_notes[g_nnotes].what = what;
		/* A copy: `why` may be a buffer that changes (urom_coll_last_error()). */
		g_notes[g_nnotes].why = why ? strdup(why) : NULL;
		g_nnotes++;
	}
	fprintf(stderr, "urom_mpi: rank %d: %s %s%s%s\n", g_rank, call, what, why ? ": " : "",
		why ? why : "");
}

static const char *const OFFLOADED = "offloaded to urom";
static const char *const PASSED = "passed to PMPI";

/* ---------------------------------------------------------------------------------------- */
/* The out-of-band allgather urom_coll needs, over a communicator. */

struct oob_req {
	MPI_Request req;
};

static urom_status_t oob_allgather(void *sbuf, void *rbuf, size_t len, void *info, void **out)
{
	struct oob_req *r = malloc(sizeof(*r));

	if (r == NULL || len > INT_MAX) {
		free(r);
		return UROM_ERR_NO_MEMORY;
	}
	if (PMPI_Iallgather(sbuf, (int)len, MPI_BYTE, rbuf, (int)len, MPI_BYTE, *(MPI_Comm *)info,
			    &r->req) != MPI_SUCCESS) {
		free(r);
		return UROM_ERR_OOB;
	}
	*out = r;
	return UROM_OK;
}

static urom_status_t oob_test(void *req)
{
	struct oob_req *r = req;
	int flag = 0;

	if (r->req == MPI_REQUEST_NULL)
		return UROM_OK;
	if (PMPI_Test(&r->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
		return UROM_ERR_OOB;
	return flag ? UROM_OK : UROM_INPROGRESS;
}

static urom_status_t oob_free(void *req)
{
	struct oob_req *r = req;

	if (r->req != MPI_REQUEST_NULL)
		PMPI_Request_free(&r->req);
	free(r);
	return UROM_OK;
}

static urom_coll_oob_t oob_over(MPI_Comm *comm)
{
	urom_coll_oob_t oob = { .allgather = oob_allgather, .req_test = oob_test,
				.req_free = oob_free, .coll_info = comm };
	int rank, size;

	PMPI_Comm_rank(*comm, &rank);
	PMPI_Comm_size(*comm, &size);
	oob.n_oob_eps = (uint32_t)size;
	oob.oob_ep = (uint32_t)rank;
	return oob;
}

/* ---------------------------------------------------------------------------------------- */
/* Communicators: a team each, in an attribute. */

struct reg {
	const void *addr;
	size_t len;
	urom_coll_buffer_h buffer;
	uint64_t used; /* when last used, for eviction */
};

struct op;

/* This rank's part of a collective: what urom_coll_rebind() replaces. */
struct part {
	uint32_t flags;
	const void *saddr, *daddr; /* user memory (NULL: none) */
	size_t slen, dlen;
	uint64_t scount, dcount;
	uint64_t *words; /* a copy of the v-variant's words */
	size_t nwords;
};

/* What every rank of the communicator passes alike (MPI requires it): the cache's key. */
struct key {
	int type, dt, op;
	uint32_t root;
	uint64_t count;
};

/* A collective set up on the worker and kept for later calls. */
struct slot {
	urom_coll_req_h coll; /* NULL until first used */
	struct op *op;        /* the call it runs for, while it runs */
	struct part part;     /* this rank's part as set up */
};

struct centry {
	struct key key;
	uint64_t uses; /* calls of this signature so far: call k uses slot k % g_depth */
	uint64_t used; /* when last used (the communicator's call count), for eviction */
	struct slot slots[MAX_DEPTH];
};

struct comm_state {
	MPI_Comm comm;
	MPI_Comm oob_comm; /* a duplicate, for the team's out-of-band exchange */
	urom_coll_team_h team; /* NULL: everything on this communicator goes to PMPI */
	const char *why;       /* why not, when not */
	char why_buf[400];
	int size;
	int failed; /* a collective failed on it: later ones go to PMPI */
	int refs;   /* the attribute, and each collective in flight */
	struct reg regs[MAX_REGS];
	int nregs;
	uint64_t clock;
	struct centry cache[CACHE_KEYS];
	int ncache;
	uint64_t calls; /* offloaded calls that went through the cache */
	struct comm_state *next;
};

static void cache_release(struct comm_state *st);

static struct comm_state *g_states;

static void state_release(struct comm_state *st)
{
	int i;

	cache_release(st);
	for (i = 0; i < st->nregs; i++)
		urom_coll_mem_free(st->regs[i].buffer);
	st->nregs = 0;
	if (st->team != NULL)
		urom_coll_team_destroy(st->team);
	st->team = NULL;
	if (st->oob_comm != MPI_COMM_NULL)
		PMPI_Comm_free(&st->oob_comm);
}

static void state_unref(struct comm_state *st)
{
	if (--st->refs == 0)
		free(st);
}

static int state_delete(MPI_Comm comm, int keyval, void *attr, void *extra)
{
	struct comm_state *st = attr, **p;

	(void)comm;
	(void)keyval;
	(void)extra;
	for (p = &g_states; *p != NULL; p = &(*p)->next)
		if (*p == st) {
			*p = st->next;
			break;
		}
	state_release(st);
	state_unref(st);
	return MPI_SUCCESS;
}

/* Forms `comm`'s team: collective over `comm`. Leaves st->team NULL, and st->why set, when any
 * rank cannot offload on it. */
static void state_form(struct comm_state *st)
{
	MPI_Comm local;
	int local_size, here, all, rank;
	urom_status_t s = UROM_OK;
	static char probe[64];

	PMPI_Comm_size(st->comm, &st->size);
	PMPI_Comm_rank(st->comm, &rank);
	PMPI_Comm_split_type(st->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
	PMPI_Comm_size(local, &local_size);
	PMPI_Comm_free(&local);
	here = g_ctx != NULL && !g_worker_dead && local_size == st->size && st->size <= MAX_TEAM;
	PMPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, st->comm);
	if (!all) {
		if (local_size != st->size)
			st->why = "the communicator spans several nodes (urom's offload is per node)";
		else if (st->size > MAX_TEAM)
			st->why = "more than 64 ranks on the node";
		else if (g_ctx == NULL || g_worker_dead)
			st->why = g_off ? g_off : "the node's worker died";
		else
			st->why = "another rank of the communicator cannot offload";
		return;
	}
	PMPI_Comm_dup(st->comm, &st->oob_comm);
	urom_coll_team_params_t params = { .oob = oob_over(&st->oob_comm) };
	s = urom_coll_team_create(g_ctx, &params, &st->team);
	if (s == UROM_OK) {
		/* Cross-memory attach may be forbidden here: try it once. */
		urom_coll_buffer_h b;
		s = urom_coll_mem_register(st->team, probe, sizeof(probe), &b);
		if (s == UROM_OK)
			urom_coll_mem_free(b);
	}
	if (s != UROM_OK)
		snprintf(st->why_buf, sizeof(st->why_buf), "cannot form a urom team: %s (%s)",
			 urom_status_string(s), urom_coll_last_error());
	here = s == UROM_OK;
	PMPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, st->comm);
	if (!all) {
		st->why = here ? "another rank could not form the urom team" : st->why_buf;
		state_release(st);
	}
}

/* The state of `comm`, formed on first use (collective over `comm`); NULL with `*why` set when
 * its collectives go to PMPI. */
static struct comm_state *state_of(MPI_Comm comm, const char **why)
{
	struct comm_state *st;
	int flag = 0, inter = 0;

	if (!g_ready || g_keyval == MPI_KEYVAL_INVALID) {
		*why = g_off ? g_off : "MPI_Init did not run through liburom_mpi";
		return NULL;
	}
	if (g_off != NULL && g_ctx == NULL && g_node == MPI_COMM_NULL) {
		/* Off by setting, the same on every rank: no need to ask the others. */
		*why = g_off;
		return NULL;
	}
	if (comm == MPI_COMM_NULL) {
		*why = "MPI_COMM_NULL";
		return NULL;
	}
	PMPI_Comm_test_inter(comm, &inter);
	if (inter) {
		*why = "an intercommunicator";
		return NULL;
	}
	PMPI_Comm_get_attr(comm, g_keyval, &st, &flag);
	if (!flag) {
		st = calloc(1, sizeof(*st));
		if (st == NULL) {
			*why = "out of memory";
			return NULL;
		}
		st->comm = comm;
		st->oob_comm = MPI_COMM_NULL;
		st->refs = 1;
		state_form(st);
		st->next = g_states;
		g_states = st;
		PMPI_Comm_set_attr(comm, g_keyval, st);
	}
	if (st->team == NULL) {
		*why = st->why;
		return NULL;
	}
	if (g_worker_dead || st->failed) {
		*why = g_worker_dead ? "the node's worker died" : "a collective failed on this communicator";
		return NULL;
	}
	return st;
}

/* The registered buffer for `len` bytes at `addr`; NULL for none (zero bytes) and on failure
 * (`*failed` set). */
static urom_coll_buffer_h buffer_of(struct comm_state *st, const void *addr, size_t len, int *failed)
{
	int i, victim = 0;
	urom_coll_buffer_h b;

	if (len == 0 || addr == NULL)
		return NULL;
	st->clock++;
	for (i = 0; i < st->nregs; i++)
		if (st->regs[i].addr == addr && st->regs[i].len == len) {
			st->regs[i].used = st->clock;
			return st->regs[i].buffer;
		}
	if (urom_coll_mem_register(st->team, (void *)addr, len, &b) != UROM_OK) {
		*failed = 1;
		return NULL;
	}
	if (st->nregs == MAX_REGS) {
		for (i = 1; i < st->nregs; i++)
			if (st->regs[i].used < st->regs[victim].used)
				victim = i;
		/* The registration lasts while a collective over it runs. */
		urom_coll_mem_free(st->regs[victim].buffer);
	} else {
		victim = st->nregs++;
	}
	st->regs[victim] = (struct reg){ addr, len, b, st->clock };
	return b;
}

/* ---------------------------------------------------------------------------------------- */
/* Collectives in flight, the set-up collectives kept, and the progress hook. */

struct op {
	MPI_Request req; /* the generalized request, or a persistent request's handle;
			    MPI_REQUEST_NULL for a blocking call */
	urom_coll_req_h coll;
	struct slot *slot; /* the cache slot whose collective it runs, or NULL */
	int owned;         /* coll is this op's: freed when it completes */
	int persistent;    /* an MPIX_*_init request: its collective stays, started again */
	int active;        /* persistent: started, and its completion not yet returned */
	int freed;         /* persistent: MPI_Request_free'd while it ran */
	struct comm_state *st;
	MPI_Comm comm;
	int done;  /* non-persistent: completed; persistent: its last start completed */
	int error; /* MPI_SUCCESS or MPI_ERR_OTHER, once done */
	struct op *next;
};

static struct op *g_ops;

static void unlink_op(struct op *op)
{
	struct op **p;

	for (p = &g_ops; *p != NULL; p = &(*p)->next)
		if (*p == op) {
			*p = op->next;
			break;
		}
}

/* A persistent op released: its collective, its hold on the communicator, itself. */
static void persistent_destroy(struct op *op)
{
	unlink_op(op);
	if (op->coll != NULL)
		urom_coll_free(op->coll);
	state_unref(op->st);
	free(op);
}

static void op_finish(struct op *op, urom_status_t s)
{
	op->done = 1;
	op->error = s == UROM_OK ? MPI_SUCCESS : MPI_ERR_OTHER;
	if (s != UROM_OK) {
		if (s == UROM_ERR_WORKER)
			g_worker_dead = 1;
		op->st->failed = 1;
		note("a collective", "failed", urom_coll_last_error());
	}
	if (op->persistent) {
		if (op->freed)
			persistent_destroy(op);
		return;
	}
	if (op->slot != NULL && op->slot->op == op)
		op->slot->op = NULL;
	op->slot = NULL;
	if (op->owned && op->coll != NULL)
		urom_coll_free(op->coll);
	op->coll = NULL;
	state_unref(op->st);
	op->st = NULL;
	if (op->req != MPI_REQUEST_NULL)
		PMPI_Grequest_complete(op->req); /* may free op (free_fn) */
}

/* Completes what finished; runs in every call intercepted here. */
static void progress(void)
{
	struct op *op, *next;
	urom_status_t s;

	for (op = g_ops; op != NULL; op = next) {
		next = op->next; /* op_finish may free op */
		if (!op->done && op->coll != NULL && (s = urom_coll_test(op->coll)) != UROM_INPROGRESS)
			op_finish(op, s);
	}
}

/* Lets MPI progress its own requests (which another rank's collective may wait for), then
 * gives the processor away now and then: the worker may share it. */
static void idle(unsigned *spins)
{
	int flag;

	PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
	if (++*spins > 100)
		sched_yield();
}

static struct op *op_of(MPI_Request req)
{
	struct op *op;

	if (req == MPI_REQUEST_NULL)
		return NULL;
	for (op = g_ops; op != NULL; op = op->next)
		if (op->req == req)
			return op;
	return NULL;
}

/* A persistent request of ours that was started and whose completion was not yet returned. */
static struct op *active_of(MPI_Request req)
{
	struct op *op = op_of(req);

	return op != NULL && op->persistent && op->active ? op : NULL;
}

static int query_fn(void *extra, MPI_Status *status)
{
	(void)extra;
	PMPI_Status_set_elements(status, MPI_BYTE, 0);
	PMPI_Status_set_cancelled(status, 0);
	status->MPI_SOURCE = MPI_UNDEFINED;
	status->MPI_TAG = MPI_UNDEFINED;
	status->MPI_ERROR = MPI_SUCCESS;
	return MPI_SUCCESS;
}

static int free_fn(void *extra)
{
	struct op *op = extra;

	unlink_op(op);
	free(op);
	return MPI_SUCCESS;
}

static int cancel_fn(void *extra, int complete)
{
	(void)extra;
	(void)complete;
	return MPI_SUCCESS; /* a collective cannot be cancelled; it completes normally */
}

static int raise_error(MPI_Comm comm, int error)
{
	PMPI_Comm_call_errhandler(comm, error);
	return error;
}

/* A call as the collectives below describe it: urom's arguments without their buffers, the
 * user memory behind them, and the cache's key. */
struct desc {
	urom_coll_args_t a;
	const void *saddr, *daddr; /* NULL: none */
	size_t slen, dlen;
	struct key key;
};

static int part_is(const struct part *p, const struct desc *d)
{
	return p->flags == d->a.flags && p->saddr == d->saddr && p->slen == d->slen &&
	       p->daddr == d->daddr && p->dlen == d->dlen && p->scount == d->a.src.count &&
	       p->dcount == d->a.dst.count && p->nwords == d->a.counts_len &&
	       (p->nwords == 0 || !memcmp(p->words, d->a.counts, p->nwords * sizeof(uint64_t)));
}

/* Records `d` as the part set up; 0 when out of memory. */
static int part_set(struct part *p, const struct desc *d)
{
	uint64_t *words = NULL;

	if (d->a.counts_len > 0) {
		words = malloc(d->a.counts_len * sizeof(uint64_t));
		if (words == NULL)
			return 0;
		memcpy(words, d->a.counts, d->a.counts_len * sizeof(uint64_t));
	}
	free(p->words);
	*p = (struct part){ d->a.flags, d->saddr, d->daddr, d->slen, d->dlen, d->a.src.count,
			    d->a.dst.count, words, d->a.counts_len };
	return 1;
}

/* Releases a slot's collective: now, or (running) when its call completes. */
static void slot_release(struct slot *sl)
{
	if (sl->op != NULL && !sl->op->done) {
		sl->op->slot = NULL;
		sl->op->owned = 1;
	} else if (sl->coll != NULL) {
		urom_coll_free(sl->coll);
	}
	free(sl->part.words);
	memset(sl, 0, sizeof(*sl));
}

static void entry_release(struct centry *e)
{
	int i;

	for (i = 0; i < MAX_DEPTH; i++)
		slot_release(&e->slots[i]);
}

static void cache_release(struct comm_state *st)
{
	int i;

	for (i = 0; i < st->ncache; i++)
		entry_release(&st->cache[i]);
	st->ncache = 0;
}

static int key_is(const struct key *a, const struct key *b)
{
	return a->type == b->type && a->dt == b->dt && a->op == b->op && a->root == b->root &&
	       a->count == b->count;
}

/* The slot this call of signature `key` uses; every rank of the communicator picks the same
 * one (the key and the order of calls are the same on all), and waits while its previous use,
 * `g_depth` calls of this signature ago, still runs here. */
static struct slot *slot_for(struct comm_state *st, const struct key *key)
{
	struct centry *e = NULL;
	struct slot *sl;
	unsigned spins = 0;
	int i, lru = 0;

	for (i = 0; i < st->ncache; i++)
		if (key_is(&st->cache[i].key, key)) {
			e = &st->cache[i];
			break;
		}
	if (e == NULL) {
		if (st->ncache < CACHE_KEYS) {
			e = &st->cache[st->ncache++];
		} else {
			for (i = 1; i < st->ncache; i++)
				if (st->cache[i].used < st->cache[lru].used)
					lru = i;
			e = &st->cache[lru];
			entry_release(e);
		}
		memset(e, 0, sizeof(*e));
		e->key = *key;
	}
	e->used = ++st->calls;
	sl = &e->slots[e->uses++ % (uint64_t)g_depth];
	while (sl->op != NULL && !sl->op->done) {
		idle(&spins);
		progress();
	}
	return sl;
}

/* Registers `d`'s buffers into `a`; 0 when one failed. */
static int register_buffers(struct comm_state *st, struct desc *d)
{
	int failed = 0;

	d->a.src.buffer = buffer_of(st, d->saddr, d->slen, &failed);
	d->a.dst.buffer = buffer_of(st, d->daddr, d->dlen, &failed);
	return !failed;
}

/* What run() decided. */
#define FALLBACK (-1)
#define REGISTRATION_FAILED (-2)

/* A collective set up for `d` on `st`'s team: a slot's (kept, rebound when this rank's part
 * changed) or, with `*sl` NULL, a new one. UROM_OK, or the failure (`*failed_reg` set when a
 * buffer's registration failed). */
static urom_status_t set_up(const char *call, struct comm_state *st, struct desc *d,
			    struct slot *sl, urom_coll_req_h *coll, int *failed_reg)
{
	urom_status_t s;

	if (sl != NULL && sl->coll != NULL && part_is(&sl->part, d)) {
		note(call, "reuses", "a collective set up on the worker by an earlier call");
		*coll = sl->coll;
		return UROM_OK;
	}
	if (!register_buffers(st, d)) {
		*failed_reg = 1;
		return UROM_ERR_CROSS_MEMORY;
	}
	if (sl == NULL)
		return urom_coll_init(st->team, &d->a, coll);
	if (sl->coll != NULL) {
		s = urom_coll_rebind(sl->coll, &d->a);
		if (s == UROM_OK)
			note(call, "reuses", "a collective set up on the worker, this rank's buffers rebound");
	} else {
		s = urom_coll_init(st->team, &d->a, &sl->coll);
	}
	if (s == UROM_OK && !part_set(&sl->part, d))
		s = UROM_ERR_NO_MEMORY;
	if (s != UROM_OK) {
		slot_release(sl);
		return s;
	}
	*coll = sl->coll;
	return UROM_OK;
}

/* Runs `d` on `st`'s team: blocking when `request` is NULL, else returns a generalized
 * request in it. FALLBACK when urom cannot take it (the worker is gone: every rank sees that
 * the same way), REGISTRATION_FAILED, else an MPI error code. `trivial`: nothing to move (a
 * zero count). */
static int run(const char *call, MPI_Comm comm, struct comm_state *st, struct desc *d,
	       int trivial, MPI_Request *request)
{
	urom_status_t s = UROM_OK;
	struct op local = { .req = MPI_REQUEST_NULL }, *op = &local;
	struct slot *sl = NULL;
	unsigned spins = 0;
	int failed_reg = 0;

	if (request != NULL) {
		op = calloc(1, sizeof(*op));
		if (op == NULL)
			return FALLBACK;
		op->req = MPI_REQUEST_NULL;
	}
	op->comm = comm;
	op->st = st;
	st->refs++;
	if (!trivial) {
		if (g_depth > 0)
			sl = slot_for(st, &d->key);
		s = set_up(call, st, d, sl, &op->coll, &failed_reg);
		if (s == UROM_OK) {
			op->slot = sl;
			op->owned = sl == NULL;
			if (sl != NULL)
				sl->op = op;
			if ((s = urom_coll_start(op->coll)) != UROM_OK) {
				if (sl != NULL) {
					sl->op = NULL;
					slot_release(sl);
				} else {
					urom_coll_free(op->coll);
				}
				op->coll = NULL;
			}
		}
		if (s != UROM_OK) {
			if (s == UROM_ERR_WORKER)
				g_worker_dead = 1;
			if (!failed_reg)
				note(call, PASSED, urom_coll_last_error());
			state_unref(st);
			if (op != &local)
				free(op);
			return failed_reg ? REGISTRATION_FAILED : FALLBACK;
		}
	}
	note(call, OFFLOADED, NULL);
	if (request == NULL) {
		if (trivial) {
			state_unref(st);
			return MPI_SUCCESS;
		}
		while ((s = urom_coll_test(op->coll)) == UROM_INPROGRESS)
			idle(&spins);
		op_finish(op, s);
		return op->error == MPI_SUCCESS ? MPI_SUCCESS : raise_error(comm, op->error);
	}
	PMPI_Grequest_start(query_fn, free_fn, cancel_fn, op, &op->req);
	op->next = g_ops;
	g_ops = op;
	*request = op->req;
	if (trivial)
		op_finish(op, UROM_OK);
	return MPI_SUCCESS;
}

/* Sets `d` up as a persistent collective whose handle goes to `*request`: FALLBACK when urom
 * cannot take it, REGISTRATION_FAILED, else MPI_SUCCESS. The handle is an inactive persistent
 * request of MPI's own (a receive from MPI_PROC_NULL, never started), so that MPI's completion
 * calls treat it as an inactive request; the calls intercepted here recognise it. */
static int run_init(const char *call, struct comm_state *st, MPI_Comm comm, struct desc *d,
		    int trivial, MPI_Request *request)
{
	struct op *op = calloc(1, sizeof(*op));
	urom_status_t s;
	int failed_reg = 0;

	if (op == NULL)
		return FALLBACK;
	if (!trivial) {
		s = set_up(call, st, d, NULL, &op->coll, &failed_reg);
		if (s != UROM_OK) {
			if (s == UROM_ERR_WORKER)
				g_worker_dead = 1;
			if (!failed_reg)
				note(call, PASSED, urom_coll_last_error());
			free(op);
			return failed_reg ? REGISTRATION_FAILED : FALLBACK;
		}
	}
	if (PMPI_Recv_init(NULL, 0, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_SELF, &op->req) !=
	    MPI_SUCCESS) {
		if (op->coll != NULL)
			urom_coll_free(op->coll);
		free(op);
		return FALLBACK;
	}
	op->persistent = 1;
	op->done = 1;
	op->comm = comm;
	op->st = st;
	st->refs++;
	op->next = g_ops;
	g_ops = op;
	*request = op->req;
	note(call, OFFLOADED, "persistent: set up once, started by MPI_Start");
	return MPI_SUCCESS;
}

/* MPI_Start for a persistent request of ours. A start that fails (the worker died) completes
 * at once with MPI_ERR_OTHER. */
static int persistent_start(struct op *op)
{
	urom_status_t s;

	if (op->active)
		return raise_error(op->comm, MPI_ERR_REQUEST);
	op->active = 1;
	op->done = 0;
	op->error = MPI_SUCCESS;
	if (op->coll == NULL) {
		op->done = 1;
		return MPI_SUCCESS;
	}
	if ((s = urom_coll_start(op->coll)) != UROM_OK)
		op_finish(op, s);
	return MPI_SUCCESS;
}

/* ---------------------------------------------------------------------------------------- */
/* Datatypes and operations. */

/* A predefined type urom reduces in; 0 when none. */
static int reduce_type(MPI_Datatype dt, urom_datatype_t *out)
{
	if (dt == MPI_INT8_T || dt == MPI_SIGNED_CHAR || dt == MPI_CHAR)
		*out = UROM_DT_INT8;
	else if (dt == MPI_UINT8_T || dt == MPI_UNSIGNED_CHAR || dt == MPI_BYTE)
		*out = UROM_DT_UINT8;
	else if (dt == MPI_INT16_T || dt == MPI_SHORT)
		*out = UROM_DT_INT16;
	else if (dt == MPI_UINT16_T || dt == MPI_UNSIGNED_SHORT)
		*out = UROM_DT_UINT16;
	else if (dt == MPI_INT32_T || dt == MPI_INT)
		*out = UROM_DT_INT32;
	else if (dt == MPI_UINT32_T || dt == MPI_UNSIGNED)
		*out = UROM_DT_UINT32;
	else if (dt == MPI_INT64_T || dt == MPI_LONG_LONG || (dt == MPI_LONG && sizeof(long) == 8))
		*out = UROM_DT_INT64;
	else if (dt == MPI_UINT64_T || dt == MPI_UNSIGNED_LONG_LONG ||
		 (dt == MPI_UNSIGNED_LONG && sizeof(long) == 8))
		*out = UROM_DT_UINT64;
	else if (dt == MPI_FLOAT)
		*out = UROM_DT_FLOAT32;
	else if (dt == MPI_DOUBLE)
		*out = UROM_DT_FLOAT64;
	else
		return 0;
	return 1;
}

/* urom's operation for `op` on `dt`; 0 (with `*why`) when none. */
static int reduce_op(MPI_Op op, urom_datatype_t dt, urom_op_t *out, const char **why)
{
	int is_float = dt == UROM_DT_FLOAT32 || dt == UROM_DT_FLOAT64;

	if (op == MPI_SUM)
		*out = UROM_OP_SUM;
	else if (op == MPI_PROD)
		*out = UROM_OP_PROD;
	else if (op == MPI_MIN)
		*out = UROM_OP_MIN;
	else if (op == MPI_MAX)
		*out = UROM_OP_MAX;
	else if (!is_float && op == MPI_BAND)
		*out = UROM_OP_BAND;
	else if (!is_float && op == MPI_BOR)
		*out = UROM_OP_BOR;
	else if (!is_float && op == MPI_BXOR)
		*out = UROM_OP_BXOR;
	else if (!is_float && op == MPI_LAND)
		*out = UROM_OP_LAND;
	else if (!is_float && op == MPI_LOR)
		*out = UROM_OP_LOR;
	else if (!is_float && op == MPI_LXOR)
		*out = UROM_OP_LXOR;
	else {
		*why = is_float && (op == MPI_BAND || op == MPI_BOR || op == MPI_BXOR || op == MPI_LAND ||
				    op == MPI_LOR || op == MPI_LXOR)
			       ? "a bitwise or logical operation on a floating-point type"
			       : "a user-defined or location operation (MINLOC, MAXLOC, REPLACE...)";
		return 0;
	}
	return 1;
}

/* The size of `dt` when its elements lie back to back with no gap (a predefined type, or a
 * derived one such as a contiguous type); 0 otherwise. */
static size_t dense_size(MPI_Datatype dt)
{
	int size;
	MPI_Aint lb, extent, true_lb, true_extent;

	if (dt == MPI_DATATYPE_NULL || PMPI_Type_size(dt, &size) != MPI_SUCCESS || size <= 0)
		return 0;
	PMPI_Type_get_extent(dt, &lb, &extent);
	PMPI_Type_get_true_extent(dt, &true_lb, &true_extent);
	if (lb != 0 || true_lb != 0 || extent != size || true_extent != size)
		return 0;
	return (size_t)size;
}

static const char *const NOT_DENSE =
	"a derived datatype with gaps (only types whose elements lie back to back are offloaded)";
static const char *const NOT_REDUCIBLE =
	"a datatype urom does not reduce in (it reduces int8-64, uint8-64, float, double)";

/* A buffer could not be registered (the team's cross-memory probe passed, so this is rare):
 * the other ranks may already be in the collective; the program gets the error. */
static int registration_failed(const char *call, MPI_Comm comm)
{
	static char why[400];

	snprintf(why, sizeof(why), "cross-memory attach of a buffer failed (%s)",
		 urom_coll_last_error());
	note(call, "failed", why);
	return raise_error(comm, MPI_ERR_OTHER);
}

/* A (size, datatype) pair mapped for reductions. */
struct reduction {
	urom_datatype_t dt;
	urom_op_t op;
	size_t size;
};

static int map_reduction(MPI_Datatype dt, MPI_Op op, struct reduction *r, const char **why)
{
	if (!reduce_type(dt, &r->dt)) {
		*why = NOT_REDUCIBLE;
		return 0;
	}
	if (!reduce_op(op, r->dt, &r->op, why))
		return 0;
	r->size = dense_size(dt);
	return r->size != 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Initialisation and finalisation. */

static void setup(int provided)
{
	const char *v = getenv("UROM_MPI_VERBOSE"), *off = getenv("UROM_MPI_OFFLOAD");
	const char *depth = getenv("UROM_MPI_CACHE_DEPTH");
	urom_status_t s;

	g_verbose = v != NULL && strcmp(v, "0") != 0 && *v != '\0';
	if (depth != NULL && *depth != '\0') {
		/* The same on every rank (mpirun passes the environment alike). */
		long d = strtol(depth, NULL, 10);
		g_depth = d < 0 ? 0 : d > MAX_DEPTH ? MAX_DEPTH : (int)d;
	}
	PMPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
	g_ready = 1;
	if (off != NULL && strcmp(off, "0") == 0) {
		g_off = "UROM_MPI_OFFLOAD=0";
	} else if (provided > MPI_THREAD_FUNNELED) {
		g_off = "the program asked for MPI_THREAD_SERIALIZED or MULTIPLE (urom's progress "
			"belongs to one thread)";
	}
	if (g_off != NULL) {
		note("MPI_Init", "offload off", g_off);
		return;
	}
	PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, state_delete, &g_keyval, NULL);
	PMPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &g_node);
	urom_coll_context_params_t params = { .oob = oob_over(&g_node), .service_socket = NULL };
	s = urom_coll_context_create(&params, &g_ctx);
	if (s != UROM_OK) {
		g_ctx = NULL;
		snprintf(g_off_buf, sizeof(g_off_buf), "no urom service on this node: %s",
			 urom_coll_last_error());
		g_off = g_off_buf;
		note("MPI_Init", "offload off", g_off);
		return;
	}
	note("MPI_Init", "offload on", "this node's ranks share one urom worker");
}

EXPORT int MPI_Init(int *argc, char ***argv)
{
	int rc = PMPI_Init(argc, argv), provided = MPI_THREAD_SINGLE;

	if (rc == MPI_SUCCESS) {
		PMPI_Query_thread(&provided);
		setup(provided);
	}
	return rc;
}

EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	int rc = PMPI_Init_thread(argc, argv, required, provided);

	if (rc == MPI_SUCCESS)
		setup(*provided);
	return rc;
}

EXPORT int MPI_Finalize(void)
{
	unsigned spins = 0;
	struct op *op, *next;
	int pending;

	if (g_ready) {
		/* Collectives still running finish first (their requests were freed or never
		 * waited for). */
		do {
			progress();
			pending = 0;
			for (op = g_ops; op != NULL; op = op->next)
				pending |= !op->done;
			if (pending)
				idle(&spins);
		} while (pending);
		/* Persistent requests the program did not free. */
		for (op = g_ops; op != NULL; op = next) {
			next = op->next;
			if (op->persistent)
				persistent_destroy(op);
		}
		while (g_states != NULL)
			PMPI_Comm_delete_attr(g_states->comm, g_keyval);
		if (g_keyval != MPI_KEYVAL_INVALID)
			PMPI_Comm_free_keyval(&g_keyval);
		if (g_ctx != NULL)
			urom_coll_context_destroy(g_ctx);
		g_ctx = NULL;
		if (g_node != MPI_COMM_NULL)
			PMPI_Comm_free(&g_node);
		g_ready = 0;
	}
	return PMPI_Finalize();
}

EXPORT int MPI_Comm_free(MPI_Comm *comm)
{
	progress();
	/* The attribute's delete callback destroys the communicator's team. */
	return PMPI_Comm_free(comm);
}

/* ---------------------------------------------------------------------------------------- */
/* The collectives. Each maps its arguments, or notes why not and calls PMPI_*. */

/* How a collective was called: MPI_X, MPI_IX or MPIX_X_init. */
enum how { BLOCKING, NONBLOCKING, PERSISTENT };

static struct desc desc_of(urom_coll_type_t type, urom_datatype_t dt)
{
	struct desc d;

	memset(&d, 0, sizeof(d));
	d.a.coll_type = type;
	d.a.datatype = dt;
	d.key.type = (int)type;
	d.key.dt = (int)dt;
	return d;
}

/* Hands `d` to urom as `how` asks; FALLBACK (`*why` says why) when urom cannot take it, else
 * an MPI code. */
static int offload(const char *call, MPI_Comm comm, struct comm_state *st, struct desc *d,
		   int trivial, enum how how, MPI_Request *req, const char **why)
{
	int rc = how == PERSISTENT ? run_init(call, st, comm, d, trivial, req)
				   : run(call, comm, st, d, trivial, how == BLOCKING ? NULL : req);

	if (rc == FALLBACK)
		*why = "the urom worker is gone";
	return rc == REGISTRATION_FAILED ? registration_failed(call, comm) : rc;
}

#if UROM_MPI_PCOLL
#define PCOLL(x) x
#else
#define PCOLL(x) MPI_ERR_OTHER
#endif

/* Ends a collective's do_* function where urom did not take the call: notes why and passes it
 * to MPI's own collective in the form `how` asks, with the arguments `...`: PMPI_<Name>
 * (blocking), PMPI_<Iname> (non-blocking, its request `req`) or PMPIX_<Name>_init (persistent,
 * `info` and `req`). */
#define PASS_ON(Name, Iname, ...)                                                               \
	do {                                                                                    \
		note(call, PASSED, why);                                                        \
		(void)info;                                                                     \
		switch (how) {                                                                  \
		case BLOCKING:                                                                  \
			return PMPI_##Name(__VA_ARGS__);                                        \
		case NONBLOCKING:                                                               \
			return PMPI_##Iname(__VA_ARGS__, req);                                  \
		default:                                                                        \
			return PCOLL(PMPIX_##Name##_init(__VA_ARGS__, info, req));              \
		}                                                                               \
	} while (0)

#define UNPAREN(...) __VA_ARGS__

#if UROM_MPI_PCOLL
#define PERSISTENT_ENTRY(Name, impl, params, args)                                              \
	EXPORT int MPIX_##Name##_init(UNPAREN params, MPI_Info info, MPI_Request *req)          \
	{                                                                                       \
		return impl("MPIX_" #Name "_init", UNPAREN args, PERSISTENT, info, req);        \
	}
#else
#define PERSISTENT_ENTRY(Name, impl, params, args)
#endif

/* The entry points of the collective `impl` (a do_* function) does: MPI_<Name> (blocking),
 * MPI_<Iname> (non-blocking) and, with Open MPI's persistent collectives, MPIX_<Name>_init.
 * `params` are the blocking form's parameters and `args` the arguments `impl` takes between
 * the call's name and its form, each in parentheses. */
#define ENTRY_POINTS(Name, Iname, impl, params, args)                                           \
	EXPORT int MPI_##Name(UNPAREN params)                                                   \
	{                                                                                       \
		return impl("MPI_" #Name, UNPAREN args, BLOCKING, MPI_INFO_NULL, NULL);         \
	}                                                                                       \
                                                                                                \
	EXPORT int MPI_##Iname(UNPAREN params, MPI_Request *req)                                \
	{                                                                                       \
		return impl("MPI_" #Iname, UNPAREN args, NONBLOCKING, MPI_INFO_NULL, req);      \
	}                                                                                       \
                                                                                                \
	PERSISTENT_ENTRY(Name, impl, params, args)

static int do_allreduce(const char *call, const void *sbuf, void *rbuf, int count,
			MPI_Datatype dt, MPI_Op op, MPI_Comm comm, enum how how, MPI_Info info,
			MPI_Request *req)
{
	const char *why = NULL;
	struct reduction r;
	struct comm_state *st;
	int in_place = sbuf == MPI_IN_PLACE;

	progress();
	if (!map_reduction(dt, op, &r, &why) || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	size_t bytes = (size_t)count * r.size;
	struct desc d = desc_of(UROM_COLL_ALLREDUCE, r.dt);
	d.a.op = r.op;
	d.key.op = (int)r.op;
	d.key.count = (uint64_t)count;
	d.a.flags = in_place ? UROM_COLL_FLAG_IN_PLACE : 0;
	d.saddr = in_place ? NULL : sbuf;
	d.slen = in_place ? 0 : bytes;
	d.daddr = rbuf;
	d.dlen = bytes;
	d.a.src.count = d.a.dst.count = (uint64_t)count;
	int rc = offload(call, comm, st, &d, count == 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Allreduce, Iallreduce, sbuf, rbuf, count, dt, op, comm);
}

ENTRY_POINTS(Allreduce, Iallreduce, do_allreduce,
	     (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
	     (sbuf, rbuf, count, dt, op, comm))

static int do_reduce(const char *call, const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
		     MPI_Op op, int root, MPI_Comm comm, enum how how, MPI_Info info,
		     MPI_Request *req)
{
	const char *why = NULL;
	struct reduction r;
	struct comm_state *st;
	int rank, in_place = sbuf == MPI_IN_PLACE;

	progress();
	if (!map_reduction(dt, op, &r, &why) || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	PMPI_Comm_rank(comm, &rank);
	size_t bytes = (size_t)count * r.size;
	struct desc d = desc_of(UROM_COLL_REDUCE, r.dt);
	d.a.op = r.op;
	d.a.root = (uint32_t)root;
	d.key.op = (int)r.op;
	d.key.root = (uint32_t)root;
	d.key.count = (uint64_t)count;
	d.a.flags = in_place && rank == root ? UROM_COLL_FLAG_IN_PLACE : 0;
	d.saddr = d.a.flags ? NULL : sbuf;
	d.slen = d.a.flags ? 0 : bytes;
	d.daddr = rank == root ? rbuf : NULL;
	d.dlen = rank == root ? bytes : 0;
	d.a.src.count = d.a.dst.count = (uint64_t)count;
	int rc = offload(call, comm, st, &d, count == 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Reduce, Ireduce, sbuf, rbuf, count, dt, op, root, comm);
}

ENTRY_POINTS(Reduce, Ireduce, do_reduce,
	     (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,
	      MPI_Comm comm),
	     (sbuf, rbuf, count, dt, op, root, comm))

static int do_reduce_scatter_block(const char *call, const void *sbuf, void *rbuf, int rcount,
				   MPI_Datatype dt, MPI_Op op, MPI_Comm comm, enum how how,
				   MPI_Info info, MPI_Request *req)
{
	const char *why = NULL;
	struct reduction r;
	struct comm_state *st;
	int in_place = sbuf == MPI_IN_PLACE;

	progress();
	if (!map_reduction(dt, op, &r, &why) || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	size_t block = (size_t)rcount * r.size, all = block * (size_t)st->size;
	struct desc d = desc_of(UROM_COLL_REDUCE_SCATTER_BLOCK, r.dt);
	d.a.op = r.op;
	d.key.op = (int)r.op;
	d.key.count = (uint64_t)rcount;
	d.a.flags = in_place ? UROM_COLL_FLAG_IN_PLACE : 0;
	d.saddr = in_place ? NULL : sbuf;
	d.slen = in_place ? 0 : all;
	d.daddr = rbuf;
	d.dlen = in_place ? all : block;
	d.a.src.count = d.a.dst.count = (uint64_t)rcount;
	int rc = offload(call, comm, st, &d, rcount == 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Reduce_scatter_block, Ireduce_scatter_block, sbuf, rbuf, rcount, dt, op, comm);
}

ENTRY_POINTS(Reduce_scatter_block, Ireduce_scatter_block, do_reduce_scatter_block,
	     (const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
	     (sbuf, rbuf, rcount, dt, op, comm))

static int do_bcast(const char *call, void *buf, int count, MPI_Datatype dt, int root,
		    MPI_Comm comm, enum how how, MPI_Info info, MPI_Request *req)
{
	const char *why = NOT_DENSE;
	struct comm_state *st;
	size_t size = dense_size(dt);

	progress();
	if (size == 0 || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	size_t bytes = (size_t)count * size;
	struct desc d = desc_of(UROM_COLL_BCAST, UROM_DT_UINT8);
	d.a.root = (uint32_t)root;
	d.key.root = (uint32_t)root;
	d.key.count = bytes;
	d.saddr = buf;
	d.slen = bytes;
	d.a.src.count = bytes;
	int rc = offload(call, comm, st, &d, bytes == 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Bcast, Ibcast, buf, count, dt, root, comm);
}

ENTRY_POINTS(Bcast, Ibcast, do_bcast,
	     (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),
	     (buf, count, dt, root, comm))

static int do_barrier(const char *call, MPI_Comm comm, enum how how, MPI_Info info,
		      MPI_Request *req)
{
	const char *why = NULL;
	struct comm_state *st;

	progress();
	if ((st = state_of(comm, &why)) == NULL)
		goto fallback;
	struct desc d = desc_of(UROM_COLL_BARRIER, UROM_DT_UINT8);
	int rc = offload(call, comm, st, &d, 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Barrier, Ibarrier, comm);
}

ENTRY_POINTS(Barrier, Ibarrier, do_barrier,
	     (MPI_Comm comm),
	     (comm))

/* Allgather and alltoall move bytes: any dense datatype, the same byte count on both sides. */
static int do_gather_like(const char *call, urom_coll_type_t type, const void *sbuf, int scount,
			  MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype,
			  MPI_Comm comm, enum how how, MPI_Info info, MPI_Request *req)
{
	const char *why = NOT_DENSE;
	struct comm_state *st;
	int in_place = sbuf == MPI_IN_PLACE;
	size_t rsize = dense_size(rtype), ssize = in_place ? rsize : dense_size(stype);

	progress();
	if (rsize == 0 || ssize == 0 || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	size_t n = (size_t)st->size, rblock = (size_t)rcount * rsize;
	size_t sblock = in_place ? rblock : (size_t)scount * ssize;
	if (sblock != rblock) {
		why = "send and receive byte counts differ";
		goto fallback;
	}
	size_t sbytes = type == UROM_COLL_ALLTOALL ? sblock * n : sblock;
	struct desc d = desc_of(type, UROM_DT_UINT8);
	d.key.count = rblock;
	d.a.flags = in_place ? UROM_COLL_FLAG_IN_PLACE : 0;
	d.saddr = in_place ? NULL : sbuf;
	d.slen = in_place ? 0 : sbytes;
	d.daddr = rbuf;
	d.dlen = rblock * n;
	d.a.src.count = d.a.dst.count = rblock;
	int rc = offload(call, comm, st, &d, rblock == 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	if (type == UROM_COLL_ALLGATHER)
		PASS_ON(Allgather, Iallgather, sbuf, scount, stype, rbuf, rcount, rtype, comm);
	PASS_ON(Alltoall, Ialltoall, sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

ENTRY_POINTS(Allgather, Iallgather, do_gather_like,
	     (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
	      MPI_Datatype rtype, MPI_Comm comm),
	     (UROM_COLL_ALLGATHER, sbuf, scount, stype, rbuf, rcount, rtype, comm))

ENTRY_POINTS(Alltoall, Ialltoall, do_gather_like,
	     (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
	      MPI_Datatype rtype, MPI_Comm comm),
	     (UROM_COLL_ALLTOALL, sbuf, scount, stype, rbuf, rcount, rtype, comm))

/* The end, in bytes, of the furthest non-empty block of counts/displs (in elements of `size`). */
static size_t v_end(const int *counts, const int *displs, int n, size_t size)
{
	size_t end = 0;
	int i;

	for (i = 0; i < n; i++)
		if (counts[i] > 0 && (size_t)(displs[i] + counts[i]) * size > end)
			end = (size_t)(displs[i] + counts[i]) * size;
	return end;
}

static int do_allgatherv(const char *call, const void *sbuf, int scount, MPI_Datatype stype,
			 void *rbuf, const int *rcounts, const int *displs, MPI_Datatype rtype,
			 MPI_Comm comm, enum how how, MPI_Info info, MPI_Request *req)
{
	const char *why = NOT_DENSE;
	struct comm_state *st;
	int rank, i, in_place = sbuf == MPI_IN_PLACE;
	size_t rsize = dense_size(rtype), ssize = in_place ? rsize : dense_size(stype);
	uint64_t words[2 * MAX_TEAM], total = 0;

	progress();
	if (rsize == 0 || ssize == 0 || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	PMPI_Comm_rank(comm, &rank);
	size_t sbytes = in_place ? (size_t)rcounts[rank] * rsize : (size_t)scount * ssize;
	for (i = 0; i < st->size; i++) {
		if (rcounts[i] < 0 || displs[i] < 0) {
			why = "a negative count or displacement";
			goto fallback;
		}
		words[i] = (uint64_t)rcounts[i] * rsize;
		words[st->size + i] = (uint64_t)displs[i] * rsize;
		total += words[i];
	}
	struct desc d = desc_of(UROM_COLL_ALLGATHERV, UROM_DT_UINT8);
	d.key.count = total; /* the receive counts are the same on every rank; displs are not */
	d.a.flags = in_place ? UROM_COLL_FLAG_IN_PLACE : 0;
	d.saddr = in_place ? NULL : sbuf;
	d.slen = in_place ? 0 : sbytes;
	d.a.src.count = sbytes;
	d.daddr = rbuf;
	d.dlen = v_end(rcounts, displs, st->size, rsize);
	d.a.counts = words;
	d.a.counts_len = 2 * (size_t)st->size;
	int rc = offload(call, comm, st, &d, 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Allgatherv, Iallgatherv, sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm);
}

ENTRY_POINTS(Allgatherv, Iallgatherv, do_allgatherv,
	     (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int *rcounts,
	      const int *displs, MPI_Datatype rtype, MPI_Comm comm),
	     (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm))

static int do_alltoallv(const char *call, const void *sbuf, const int *scounts, const int *sdispls,
			MPI_Datatype stype, void *rbuf, const int *rcounts, const int *rdispls,
			MPI_Datatype rtype, MPI_Comm comm, enum how how, MPI_Info info,
			MPI_Request *req)
{
	const char *why = NOT_DENSE;
	struct comm_state *st;
	int i, n;
	size_t rsize = dense_size(rtype), ssize = sbuf == MPI_IN_PLACE ? 0 : dense_size(stype);
	uint64_t words[4 * MAX_TEAM];

	progress();
	if (sbuf == MPI_IN_PLACE) {
		why = "an in-place alltoallv";
		goto fallback;
	}
	if (rsize == 0 || ssize == 0 || (st = state_of(comm, &why)) == NULL)
		goto fallback;
	n = st->size;
	for (i = 0; i < n; i++) {
		if (scounts[i] < 0 || sdispls[i] < 0 || rcounts[i] < 0 || rdispls[i] < 0) {
			why = "a negative count or displacement";
			goto fallback;
		}
		words[i] = (uint64_t)scounts[i] * ssize;
		words[n + i] = (uint64_t)sdispls[i] * ssize;
		words[2 * n + i] = (uint64_t)rcounts[i] * rsize;
		words[3 * n + i] = (uint64_t)rdispls[i] * rsize;
	}
	/* No count is the same on every rank: the key is the collective alone. */
	struct desc d = desc_of(UROM_COLL_ALLTOALLV, UROM_DT_UINT8);
	d.saddr = sbuf;
	d.slen = v_end(scounts, sdispls, n, ssize);
	d.daddr = rbuf;
	d.dlen = v_end(rcounts, rdispls, n, rsize);
	d.a.counts = words;
	d.a.counts_len = 4 * (size_t)n;
	int rc = offload(call, comm, st, &d, 0, how, req, &why);
	if (rc != FALLBACK)
		return rc;
fallback:
	PASS_ON(Alltoallv, Ialltoallv, sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype,
		comm);
}

ENTRY_POINTS(Alltoallv, Ialltoallv, do_alltoallv,
	     (const void *sbuf, const int *scounts, const int *sdispls, MPI_Datatype stype,
	      void *rbuf, const int *rcounts, const int *rdispls, MPI_Datatype rtype,
	      MPI_Comm comm),
	     (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm))

/* MPI_Start(all): ours started on the worker, the others by MPI. In array order, as every
 * rank must start persistent collectives in the same order. */
EXPORT int MPI_Start(MPI_Request *req)
{
	struct op *op;

	progress();
	if (req == NULL || (op = op_of(*req)) == NULL || !op->persistent)
		return PMPI_Start(req);
	return persistent_start(op);
}

EXPORT int MPI_Startall(int n, MPI_Request reqs[])
{
	int i, rc, first = MPI_SUCCESS;
	struct op *op;

	progress();
	for (i = 0; i < n; i++) {
		op = op_of(reqs[i]);
		rc = op != NULL && op->persistent ? persistent_start(op) : PMPI_Start(&reqs[i]);
		if (rc != MPI_SUCCESS && first == MPI_SUCCESS)
			first = rc;
	}
	return first;
}

/* ---------------------------------------------------------------------------------------- */
/* Completion calls: our non-blocking requests are generalized requests, completed by
 * progress(); our persistent ones are inactive persistent requests of MPI's own, active (for
 * us) between MPI_Start and the call that returns their completion. These calls progress ours
 * while MPI's own requests progress too, and carry a failed collective's error. */

/* Whether `op` (ours) has nothing left to wait for. */
static int op_ready(const struct op *op)
{
	return op->persistent ? !op->active || op->done : op->done;
}

/* The error of each of our requests among `reqs` that completed; MPI_SUCCESS for the rest. Sets
 * `*comm` to the communicator of the first that failed. Returns whether any failed. */
static int errors_of(int n, const MPI_Request reqs[], int errs[], MPI_Comm *comm)
{
	int i, any = 0;
	struct op *op;

	for (i = 0; i < n; i++) {
		op = op_of(reqs[i]);
		errs[i] = op != NULL && op->done && (!op->persistent || op->active) ? op->error
										    : MPI_SUCCESS;
		if (errs[i] != MPI_SUCCESS && !any) {
			any = 1;
			*comm = op->comm;
		}
	}
	return any;
}

/* Whether every one of our requests among `reqs` is done. */
static int ours_done(int n, const MPI_Request reqs[])
{
	int i;
	struct op *op;

	for (i = 0; i < n; i++)
		if ((op = op_of(reqs[i])) != NULL && !op_ready(op))
			return 0;
	return 1;
}

/* Our persistent requests among `reqs`, all complete, become inactive. */
static void deactivate_all(int n, const MPI_Request reqs[])
{
	int i;
	struct op *op;

	for (i = 0; i < n; i++)
		if ((op = active_of(reqs[i])) != NULL)
			op->active = 0;
}

EXPORT int MPI_Wait(MPI_Request *req, MPI_Status *status)
{
	struct op *op;
	unsigned spins = 0;
	int err, rc;
	MPI_Comm comm;

	progress();
	if (req == NULL || (op = op_of(*req)) == NULL)
		return PMPI_Wait(req, status);
	if (op->persistent && !op->active)
		return PMPI_Wait(req, status); /* inactive: an empty status at once */
	while (!op->done) {
		idle(&spins);
		progress();
	}
	err = op->error;
	comm = op->comm;
	op->active = 0;
	rc = PMPI_Wait(req, status); /* persistent: inactive for MPI, the handle stays */
	if (rc != MPI_SUCCESS || err == MPI_SUCCESS)
		return rc;
	if (status != MPI_STATUS_IGNORE)
		status->MPI_ERROR = err;
	return raise_error(comm, err);
}

EXPORT int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
	struct op *op;
	int err, rc;
	MPI_Comm comm;

	progress();
	if (req == NULL || (op = op_of(*req)) == NULL || (op->persistent && !op->active))
		return PMPI_Test(req, flag, status);
	if (!op->done) {
		unsigned spins = 0;
		idle(&spins);
		*flag = 0;
		return MPI_SUCCESS;
	}
	err = op->error;
	comm = op->comm;
	op->active = 0;
	rc = PMPI_Test(req, flag, status);
	if (rc != MPI_SUCCESS || err == MPI_SUCCESS || !*flag)
		return rc;
	if (status != MPI_STATUS_IGNORE)
		status->MPI_ERROR = err;
	return raise_error(comm, err);
}

/* After a call that completed all `n` requests: the error to return, with each failed one's
 * status set (the others' MPI_ERROR set to MPI_SUCCESS). */
static int finish_many(int n, const int errs[], MPI_Status statuses[], int rc, MPI_Comm comm)
{
	int i, any = 0;

	if (rc != MPI_SUCCESS)
		return rc;
	for (i = 0; i < n; i++)
		if (errs[i] != MPI_SUCCESS)
			any = 1;
	if (!any)
		return MPI_SUCCESS;
	if (statuses != MPI_STATUSES_IGNORE)
		for (i = 0; i < n; i++)
			statuses[i].MPI_ERROR = errs[i];
	PMPI_Comm_call_errhandler(comm, MPI_ERR_IN_STATUS);
	return MPI_ERR_IN_STATUS;
}

EXPORT int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status statuses[])
{
	unsigned spins = 0;
	int rc, *errs;
	MPI_Comm comm = MPI_COMM_WORLD;

	progress();
	while (!ours_done(n, reqs)) {
		idle(&spins);
		progress();
	}
	errs = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (errs == NULL) {
		deactivate_all(n, reqs);
		return PMPI_Waitall(n, reqs, statuses);
	}
	errors_of(n, reqs, errs, &comm);
	deactivate_all(n, reqs);
	rc = PMPI_Waitall(n, reqs, statuses);
	rc = finish_many(n, errs, statuses, rc, comm);
	free(errs);
	return rc;
}

EXPORT int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status statuses[])
{
	int rc, *errs;
	MPI_Comm comm = MPI_COMM_WORLD;

	progress();
	if (!ours_done(n, reqs)) {
		unsigned spins = 0;
		idle(&spins);
		*flag = 0;
		return MPI_SUCCESS;
	}
	errs = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (errs == NULL)
		return PMPI_Testall(n, reqs, flag, statuses);
	errors_of(n, reqs, errs, &comm);
	rc = PMPI_Testall(n, reqs, flag, statuses);
	if (*flag) {
		deactivate_all(n, reqs);
		rc = finish_many(n, errs, statuses, rc, comm);
	}
	free(errs);
	return rc;
}

/* Whether any of our persistent requests among `reqs` is active (MPI sees it inactive). */
static int any_active(int n, const MPI_Request reqs[])
{
	int i;

	for (i = 0; i < n; i++)
		if (active_of(reqs[i]) != NULL)
			return 1;
	return 0;
}

EXPORT int MPI_Testany(int n, MPI_Request reqs[], int *index, int *flag, MPI_Status *status)
{
	int rc, i, *errs;
	struct op *op;
	MPI_Comm comm = MPI_COMM_WORLD;

	progress();
	/* A persistent request of ours that completed: MPI would skip it as inactive. */
	for (i = 0; i < n; i++)
		if ((op = active_of(reqs[i])) != NULL && op->done) {
			int err = op->error;
			op->active = 0;
			*index = i;
			*flag = 1;
			rc = PMPI_Wait(&reqs[i], status); /* inactive: an empty status */
			if (rc != MPI_SUCCESS || err == MPI_SUCCESS)
				return rc;
			if (status != MPI_STATUS_IGNORE)
				status->MPI_ERROR = err;
			return raise_error(op->comm, err);
		}
	errs = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (errs == NULL)
		return PMPI_Testany(n, reqs, index, flag, status);
	errors_of(n, reqs, errs, &comm);
	rc = PMPI_Testany(n, reqs, index, flag, status);
	if (rc == MPI_SUCCESS && *flag && *index == MPI_UNDEFINED && any_active(n, reqs))
		*flag = 0; /* ours still run */
	if (rc == MPI_SUCCESS && *flag && *index != MPI_UNDEFINED && errs[*index] != MPI_SUCCESS) {
		if (status != MPI_STATUS_IGNORE)
			status->MPI_ERROR = errs[*index];
		rc = raise_error(comm, errs[*index]);
	}
	free(errs);
	return rc;
}

EXPORT int MPI_Waitany(int n, MPI_Request reqs[], int *index, MPI_Status *status)
{
	unsigned spins = 0;
	int flag = 0, rc;

	for (;;) {
		rc = MPI_Testany(n, reqs, index, &flag, status);
		if (rc != MPI_SUCCESS || flag)
			return rc;
		idle(&spins);
	}
}

EXPORT int MPI_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[],
			MPI_Status statuses[])
{
	int rc, i, k, active = 0, *errs;
	struct op *op;
	MPI_Comm comm = MPI_COMM_WORLD;

	progress();
	errs = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (errs == NULL)
		return PMPI_Testsome(n, reqs, outcount, indices, statuses);
	errors_of(n, reqs, errs, &comm);
	rc = PMPI_Testsome(n, reqs, outcount, indices, statuses);
	if (rc != MPI_SUCCESS) {
		free(errs);
		return rc;
	}
	/* Our persistent requests that completed follow MPI's (which sees them inactive). */
	k = *outcount == MPI_UNDEFINED ? 0 : *outcount;
	for (i = 0; i < n; i++) {
		if ((op = active_of(reqs[i])) == NULL)
			continue;
		active = 1;
		if (!op->done)
			continue;
		op->active = 0;
		indices[k] = i;
		PMPI_Wait(&reqs[i], statuses == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE
								   : &statuses[k]);
		k++;
	}
	if (k > 0 || active)
		*outcount = k;
	if (*outcount != MPI_UNDEFINED && *outcount > 0) {
		int any = 0;
		for (i = 0; i < *outcount; i++)
			if (errs[indices[i]] != MPI_SUCCESS)
				any = 1;
		if (any) {
			if (statuses != MPI_STATUSES_IGNORE)
				for (i = 0; i < *outcount; i++)
					statuses[i].MPI_ERROR = errs[indices[i]];
			PMPI_Comm_call_errhandler(comm, MPI_ERR_IN_STATUS);
			rc = MPI_ERR_IN_STATUS;
		}
	}
	free(errs);
	return rc;
}

EXPORT int MPI_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[],
			MPI_Status statuses[])
{
	unsigned spins = 0;
	int rc;

	for (;;) {
		rc = MPI_Testsome(n, reqs, outcount, indices, statuses);
		if (rc != MPI_SUCCESS || *outcount != 0)
			return rc;
		idle(&spins);
	}
}

EXPORT int MPI_Request_free(MPI_Request *req)
{
	struct op *op;
	int rc;

	progress();
	if (req == NULL || (op = op_of(*req)) == NULL || !op->persistent)
		/* A generalized request freed before it completed is released when progress()
		 * completes it; its collective runs to its end. */
		return PMPI_Request_free(req);
	/* A persistent one: its handle goes now; its collective, if it runs, first completes. */
	rc = PMPI_Request_free(req);
	op->req = MPI_REQUEST_NULL;
	if (op->active && !op->done)
		op->freed = 1;
	else
		persistent_destroy(op);
	return rc;
}
