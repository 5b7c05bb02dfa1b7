/*
 * ranks.h - the two ranks of urom's C API domain tests, as a DOCA UROM host runs them: two
 * processes (fork) joined by a socket pair, the out-of-band allgather the program implements
 * itself over it (non-blocking, tested from req_test), and the waits on a context's state.
 * Include it after defining _GNU_SOURCE.
 */
#ifndef UROM_TEST_RANKS_H_
#define UROM_TEST_RANKS_H_

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

#define RANKS 2
/* How long any wait may take, in seconds. */
#define WAIT_SECONDS 60

/* The out-of-band collective: this rank's end of the socket pair to the other rank. */
struct oob {
	int fd;
	uint32_t rank;
	int live; /* requests not yet freed */
	int allgathers;
};

struct oob_req {
	struct oob *oob;
	const uint8_t *send;
	uint8_t *recv; /* where the other rank's block goes */
	size_t len, sent, got;
};

static doca_error_t oob_allgather(void *sbuf, void *rbuf, size_t msglen, void *coll_info, void **req)
{
	struct oob *oob = coll_info;
	struct oob_req *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return DOCA_ERROR_NO_MEMORY;
	r->oob = oob;
	r->send = sbuf;
	r->recv = (uint8_t *)rbuf + (size_t)(1 - oob->rank) * msglen;
	r->len = msglen;
	memcpy((uint8_t *)rbuf + (size_t)oob->rank * msglen, sbuf, msglen);
	oob->live++;
	oob->allgathers++;
	*req = r;
	return DOCA_SUCCESS;
}

static doca_error_t oob_test(void *req)
{
	struct oob_req *r = req;
	ssize_t n;

	while (r->sent < r->len) {
		n = send(r->oob->fd, r->send + r->sent, r->len - r->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0)
			r->sent += (size_t)n;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		else
			return DOCA_ERROR_CONNECTION_ABORTED;
	}
	while (r->got < r->len) {
		n = recv(r->oob->fd, r->recv + r->got, r->len - r->got, MSG_DONTWAIT);
		if (n > 0)
			r->got += (size_t)n;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		else
			return DOCA_ERROR_CONNECTION_ABORTED;
	}
	return r->sent == r->len && r->got == r->len ? DOCA_SUCCESS : DOCA_ERROR_IN_PROGRESS;
}

static doca_error_t oob_free(void *req)
{
	struct oob_req *r = req;

	r->oob->live--;
	free(r);
	return DOCA_SUCCESS;
}

/* The collective a domain of RANKS ranks is given, over `oob`, for rank `oob->rank`. */
static inline struct doca_urom_domain_oob_coll oob_coll(struct oob *oob)
{
	struct doca_urom_domain_oob_coll coll = {
		.allgather = oob_allgather,
		.req_test = oob_test,
		.req_free = oob_free,
		.coll_info = oob,
		.n_oob_indexes = RANKS,
		.oob_index = oob->rank,
	};

	return coll;
}

/* An allgather of one byte, waited for: every rank got here. */
static inline void barrier(struct doca_urom_domain_oob_coll *coll)
{
	uint8_t mine = 1, all[RANKS];
	void *req;
	doca_error_t r;
	time_t deadline = time(NULL) + WAIT_SECONDS;

	OK(coll->allgather(&mine, all, 1, coll->coll_info, &req));
	while ((r = coll->req_test(req)) == DOCA_ERROR_IN_PROGRESS)
		CHECK(time(NULL) < deadline, "the other rank did not reach the barrier");
	OK(r);
	OK(coll->req_free(req));
}

static inline enum doca_ctx_states state_of(struct doca_ctx *ctx)
{
	enum doca_ctx_states state;

	OK(doca_ctx_get_state(ctx, &state));
	return state;
}

/* Progresses `pe` until `ctx` leaves `from`, for at most WAIT_SECONDS; returns its state. */
static inline enum doca_ctx_states progress_from(struct doca_pe *pe,
						 struct doca_ctx *ctx,
						 enum doca_ctx_states from)
{
	time_t deadline = time(NULL) + WAIT_SECONDS;

	while (state_of(ctx) == from) {
		CHECK(time(NULL) < deadline, "the context stayed in state %d", (int)from);
		doca_pe_progress(pe);
	}
	return state_of(ctx);
}

/* Stops `worker` (progressing `pe` until it is idle), then `service`, and destroys all three. */
static inline void end_rank(struct doca_pe *pe, struct doca_urom_service *service, struct doca_urom_worker *worker)
{
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(doca_urom_worker_as_ctx(worker)));
	progress_from(pe, doca_urom_worker_as_ctx(worker), DOCA_CTX_STATE_STOPPING);
	while (doca_pe_progress(pe))
		;
	OK(doca_urom_worker_destroy(worker));
	OK(doca_ctx_stop(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
}

/*
 * Runs `run_rank(rank, fd)` for rank 1 in a forked child (which ends with its parent) and rank 0
 * here, each with its end `fd` of a socket pair; returns once both passed, and ends the program
 * with status 2 when either failed.
 */
static inline void run_ranks(void (*run_rank)(uint32_t rank, int fd))
{
	int sv[2];
	pid_t child;
	int status;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno));
	child = fork();
	CHECK(child >= 0, "fork: %s", strerror(errno));
	if (child == 0) {
		/* Rank 1 ends with rank 0. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(sv[0]);
		run_rank(1, sv[1]);
		exit(0);
	}
	close(sv[1]);
	run_rank(0, sv[0]);
	CHECK(waitpid(child, &status, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 ended with status %#x", status);
}

#endif /* UROM_TEST_RANKS_H_ */
