/*
 * coll.c - urom_coll.h driven from C by N ranks (processes forked here) against a real
 * daemon offering worker_coll: `coll N` runs the collectives, the misuse checks and a
 * sub-team; `coll N kill` kills the worker during a 64 MiB allreduce. The out-of-band
 * allgather is the program's own, over memory shared by the forked ranks.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <urom_coll.h>

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "rank %u: %s:%d: check failed: %s: ", my_rank, __FILE__, \
				__LINE__, #cond);                                          \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, " (last error: %s)\n", urom_coll_last_error());   \
			exit(2);                                                           \
		}                                                                          \
	} while (0)

#define IS(expected, call)                                                                 \
	do {                                                                               \
		urom_status_t r_ = (call);                                                 \
		CHECK(r_ == (expected), "%s gave %s, expected %s", #call,                  \
		      urom_status_string(r_), urom_status_string(expected));               \
	} while (0)

#define OK(call) IS(UROM_OK, call)

#define MAX_RANKS 8
#define MAX_MSG 256
#define WAIT_SECONDS 120

static unsigned my_rank;

/* ---- The out-of-band allgather: a board in shared memory, two rounds double-buffered. */

struct board {
	_Atomic uint64_t round[MAX_RANKS];
	uint8_t data[2][MAX_RANKS][MAX_MSG];
};

struct oob {
	struct board *board;
	uint32_t size, rank;
	uint64_t next; /* this member's next round */
};

struct oob_req {
	struct oob *oob;
	uint64_t round;
	uint8_t *rbuf;
	size_t len;
};

static urom_status_t oob_allgather(void *sbuf, void *rbuf, size_t msglen, void *info, void **req)
{
	struct oob *oob = info;
	struct oob_req *r;

	if (msglen > MAX_MSG || (r = calloc(1, sizeof(*r))) == NULL)
		return UROM_ERR_NO_MEMORY;
	r->oob = oob;
	r->round = oob->next++;
	r->rbuf = rbuf;
	r->len = msglen;
	memcpy(oob->board->data[r->round % 2][oob->rank], sbuf, msglen);
	atomic_store_explicit(&oob->board->round[oob->rank], r->round + 1, memory_order_release);
	*req = r;
	return UROM_OK;
}

static urom_status_t oob_test(void *req)
{
	struct oob_req *r = req;
	uint32_t i;

	for (i = 0; i < r->oob->size; i++)
		if (atomic_load_explicit(&r->oob->board->round[i], memory_order_acquire) < r->round + 1)
			return UROM_INPROGRESS;
	for (i = 0; i < r->oob->size; i++)
		memcpy(r->rbuf + i * r->len, r->oob->board->data[r->round % 2][i], r->len);
	return UROM_OK;
}

static urom_status_t oob_free(void *req)
{
	free(req);
	return UROM_OK;
}

static urom_coll_oob_t oob_coll(struct oob *oob)
{
	urom_coll_oob_t coll = {
		.allgather = oob_allgather,
		.req_test = oob_test,
		.req_free = oob_free,
		.coll_info = oob,
		.n_oob_eps = oob->size,
		.oob_ep = oob->rank,
	};
	return coll;
}

static void barrier(struct oob *oob)
{
	uint8_t mine = 1, all[MAX_RANKS];
	void *req;
	time_t deadline = time(NULL) + WAIT_SECONDS;
	urom_status_t r;

	OK(oob_allgather(&mine, all, 1, oob, &req));
	while ((r = oob_test(req)) == UROM_INPROGRESS)
		CHECK(time(NULL) < deadline, "a rank did not reach the barrier");
	oob_free(req);
}

/* ---- Helpers. */

static urom_coll_req_h init(urom_coll_team_h team, urom_coll_type_t type, urom_datatype_t dt,
			    urom_op_t op, urom_coll_buffer_h src, uint64_t scount,
			    urom_coll_buffer_h dst, uint64_t dcount, uint32_t flags)
{
	urom_coll_args_t args = {
		.coll_type = type,
		.datatype = dt,
		.op = op,
		.flags = flags,
		.src = { .buffer = src, .offset = 0, .count = scount },
		.dst = { .buffer = dst, .offset = 0, .count = dcount },
	};
	urom_coll_req_h req = NULL;

	OK(urom_coll_init(team, &args, &req));
	return req;
}

static int completions;
static urom_status_t last_completion = UROM_INPROGRESS;

static void on_complete(void *arg, urom_status_t status)
{
	CHECK(arg == &completions, "the callback's argument");
	completions++;
	last_completion = status;
}

static void *other_thread(void *req)
{
	return (void *)(intptr_t)urom_coll_test(req);
}

/* ---- The scenarios. */

static void collectives(struct oob *oob, urom_coll_team_h team, const char *socket)
{
	const uint32_t n = oob->size, r = oob->rank;
	const size_t count = 1001;
	uint32_t rank, size, i, j;

	OK(urom_coll_team_query(team, &rank, &size));
	CHECK(rank == r && size == n, "rank %u of %u", rank, size);

	/* Allreduce, int32 sum, shared memory; then in place. */
	int32_t *a, *b;
	urom_coll_buffer_h ba, bb;
	OK(urom_coll_mem_alloc(team, count * 4, (void **)&a, &ba));
	OK(urom_coll_mem_alloc(team, count * 4, (void **)&b, &bb));
	for (i = 0; i < count; i++)
		a[i] = (int32_t)(i * (r + 1)) - 7;
	urom_coll_req_h sum = init(team, UROM_COLL_ALLREDUCE, UROM_DT_INT32, UROM_OP_SUM, ba,
				   count, bb, count, 0);
	IS(UROM_OK, urom_coll_test(sum)); /* never started */
	OK(urom_coll_set_callback(sum, on_complete, &completions));
	for (int round = 0; round < 20; round++) {
		OK(urom_coll_start(sum));
		IS(UROM_ERR_BUSY, urom_coll_start(sum));
		IS(UROM_ERR_BUSY, urom_coll_free(sum));
		if (round == 0) {
			pthread_t t;
			void *got;
			CHECK(pthread_create(&t, NULL, other_thread, sum) == 0, "pthread_create");
			pthread_join(t, &got);
			CHECK((intptr_t)got == UROM_ERR_WRONG_THREAD, "from another thread: %s",
			      urom_status_string((urom_status_t)(intptr_t)got));
		}
		urom_status_t s;
		time_t deadline = time(NULL) + WAIT_SECONDS;
		while ((s = urom_coll_test(sum)) == UROM_INPROGRESS)
			CHECK(time(NULL) < deadline, "the allreduce did not complete");
		OK(s);
		for (i = 0; i < count; i++)
			CHECK(b[i] == (int32_t)(i * n * (n + 1) / 2) - 7 * (int32_t)n,
			      "allreduce element %u: %d", i, b[i]);
	}
	CHECK(completions == 20 && last_completion == UROM_OK, "%d completions", completions);
	/* One rank's part replaced alone: rank 0 sums from another buffer, the others do not
	 * take part in the rebind. */
	int32_t *c;
	urom_coll_buffer_h bc0;
	OK(urom_coll_mem_alloc(team, count * 4, (void **)&c, &bc0));
	for (i = 0; i < count; i++)
		c[i] = a[i] + 1;
	urom_coll_args_t re = {
		.coll_type = UROM_COLL_ALLREDUCE, .datatype = UROM_DT_INT32, .op = UROM_OP_SUM,
		.src = { .buffer = bc0, .count = count }, .dst = { .buffer = bb, .count = count },
	};
	if (r == 0)
		OK(urom_coll_rebind(sum, &re));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_rebind(NULL, &re));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_rebind(sum, NULL));
	for (int round = 0; round < 3; round++) {
		OK(urom_coll_start(sum));
		IS(UROM_ERR_BUSY, urom_coll_rebind(sum, &re));
		OK(urom_coll_wait(sum));
		for (i = 0; i < count; i++)
			CHECK(b[i] == (int32_t)(i * n * (n + 1) / 2) - 7 * (int32_t)n + 1,
			      "rebound allreduce element %u: %d", i, b[i]);
	}
	OK(urom_coll_free(sum));
	OK(urom_coll_mem_free(bc0));

	/* A burst of releases (each a command posted to the worker, 200 of them, more than the
	 * task slots) without progress between: the next set-up still goes through. */
	static char burst[200][64];
	for (i = 0; i < 200; i++) {
		urom_coll_buffer_h b;
		OK(urom_coll_mem_register(team, burst[i], sizeof(burst[i]), &b));
		OK(urom_coll_mem_free(b));
	}
	urom_coll_buffer_h held[100];
	urom_coll_req_h colls[100];
	for (i = 0; i < 100; i++) {
		OK(urom_coll_mem_register(team, burst[i], sizeof(burst[i]), &held[i]));
		colls[i] = init(team, UROM_COLL_BCAST, UROM_DT_UINT8, UROM_OP_SUM, held[i], 64,
				NULL, 0, 0);
	}
	for (i = 0; i < 100; i++) {
		OK(urom_coll_free(colls[i]));
		OK(urom_coll_mem_free(held[i]));
	}
	urom_coll_req_h after = init(team, UROM_COLL_ALLREDUCE, UROM_DT_INT32, UROM_OP_SUM, ba,
				     count, bb, count, 0);
	OK(urom_coll_start(after));
	OK(urom_coll_wait(after));
	OK(urom_coll_free(after));
	for (i = 0; i < count; i++)
		b[i] = (int32_t)r;
	urom_coll_req_h max = init(team, UROM_COLL_ALLREDUCE, UROM_DT_INT32, UROM_OP_MAX, NULL,
				   count, bb, count, UROM_COLL_FLAG_IN_PLACE);
	OK(urom_coll_start(max));
	OK(urom_coll_wait(max));
	for (i = 0; i < count; i++)
		CHECK(b[i] == (int32_t)n - 1, "in-place max element %u: %d", i, b[i]);
	OK(urom_coll_free(max));

	/* User memory by address: allgather and alltoall of doubles, bcast, reduce. */
	double *send = malloc(count * n * sizeof(double));
	double *recv = malloc(count * n * sizeof(double));
	urom_coll_buffer_h bs, br;
	OK(urom_coll_mem_register(team, send, count * n * sizeof(double), &bs));
	OK(urom_coll_mem_register(team, recv, count * n * sizeof(double), &br));
	for (i = 0; i < count * n; i++)
		send[i] = r * 1000.0 + i;
	urom_coll_req_h ag = init(team, UROM_COLL_ALLGATHER, UROM_DT_FLOAT64, UROM_OP_SUM, bs,
				  count, br, count, 0);
	OK(urom_coll_start(ag));
	OK(urom_coll_wait(ag));
	for (j = 0; j < n; j++)
		for (i = 0; i < count; i++)
			CHECK(recv[j * count + i] == j * 1000.0 + i, "allgather [%u][%u]", j, i);
	OK(urom_coll_free(ag));
	urom_coll_req_h a2a = init(team, UROM_COLL_ALLTOALL, UROM_DT_FLOAT64, UROM_OP_SUM, bs,
				   count, br, count, 0);
	OK(urom_coll_start(a2a));
	OK(urom_coll_wait(a2a));
	for (j = 0; j < n; j++)
		for (i = 0; i < count; i++)
			CHECK(recv[j * count + i] == j * 1000.0 + r * count + i, "alltoall [%u][%u]",
			      j, i);
	OK(urom_coll_free(a2a));
	urom_coll_args_t bargs = {
		.coll_type = UROM_COLL_BCAST, .datatype = UROM_DT_FLOAT64, .root = n - 1,
		.src = { .buffer = bs, .count = count },
	};
	urom_coll_req_h bc;
	OK(urom_coll_init(team, &bargs, &bc));
	OK(urom_coll_start(bc));
	OK(urom_coll_wait(bc));
	for (i = 0; i < count; i++)
		CHECK(send[i] == (n - 1) * 1000.0 + i, "bcast [%u]", i);
	OK(urom_coll_free(bc));
	urom_coll_args_t rargs = {
		.coll_type = UROM_COLL_REDUCE, .datatype = UROM_DT_FLOAT64, .op = UROM_OP_SUM,
		.src = { .buffer = bs, .count = count },
		.dst = { .buffer = r == 0 ? br : NULL, .count = count },
	};
	urom_coll_req_h red;
	OK(urom_coll_init(team, &rargs, &red));
	OK(urom_coll_start(red));
	OK(urom_coll_wait(red));
	if (r == 0)
		for (i = 0; i < count; i++)
			CHECK(recv[i] == n * ((n - 1) * 1000.0 + i), "reduce [%u]", i);
	OK(urom_coll_free(red));

	/* A barrier, and a zero-count allreduce without buffers. */
	urom_coll_req_h bar = init(team, UROM_COLL_BARRIER, UROM_DT_UINT8, UROM_OP_SUM, NULL, 0,
				   NULL, 0, 0);
	OK(urom_coll_start(bar));
	OK(urom_coll_wait(bar));
	OK(urom_coll_free(bar));
	urom_coll_req_h zero = init(team, UROM_COLL_ALLREDUCE, UROM_DT_FLOAT32, UROM_OP_SUM, NULL,
				    0, NULL, 0, 0);
	OK(urom_coll_start(zero));
	OK(urom_coll_wait(zero));
	OK(urom_coll_free(zero));

	/* Misuse: NULL and foreign handles, bad arguments. */
	uint64_t junk[8] = { 0 };
	urom_coll_req_h bad = NULL;
	IS(UROM_ERR_INVALID_PARAM, urom_coll_start(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_test((urom_coll_req_h)junk));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_wait(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_free(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_free((urom_coll_req_h)junk));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_mem_free(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_team_destroy(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_context_destroy(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_context_progress(NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_team_query((urom_coll_team_h)junk, &rank, NULL));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_init(team, NULL, &bad));
	IS(UROM_ERR_INVALID_PARAM, urom_coll_context_create(NULL, NULL));
	urom_coll_args_t wrong = { .coll_type = 99 };
	IS(UROM_ERR_INVALID_PARAM, urom_coll_init(team, &wrong, &bad));
	wrong.coll_type = UROM_COLL_ALLGATHERV; /* without its counts */
	IS(UROM_ERR_INVALID_PARAM, urom_coll_init(team, &wrong, &bad));
	wrong.coll_type = UROM_COLL_ALLREDUCE;
	wrong.counts_len = 4; /* counts NULL */
	IS(UROM_ERR_INVALID_PARAM, urom_coll_init(team, &wrong, &bad));
	CHECK(bad == NULL, "no collective on failure");
	IS(UROM_ERR_INVALID_PARAM, urom_coll_mem_register(team, NULL, 16, &bs));
	for (int s = UROM_ERR_INTERNAL; s <= UROM_INPROGRESS; s++)
		CHECK(strncmp(urom_status_string((urom_status_t)s), "UROM_", 5) == 0, "%d", s);
	CHECK(strlen(urom_coll_last_error()) > 0, "the last error says something");
	(void)socket;

	OK(urom_coll_mem_free(bs));
	OK(urom_coll_mem_free(br));
	free(send);
	free(recv);
	OK(urom_coll_mem_free(ba));
	OK(urom_coll_mem_free(bb));
}

/* A sub-team of the even ranks: an allreduce among them only. */
static void subteam(struct oob *all, urom_coll_context_h ctx, struct board *sub_board)
{
	if (all->rank % 2 != 0) {
		barrier(all);
		return;
	}
	struct oob sub = { .board = sub_board, .size = (all->size + 1) / 2, .rank = all->rank / 2 };
	urom_coll_team_params_t params = { .oob = oob_coll(&sub) };
	urom_coll_team_h team;
	OK(urom_coll_team_create(ctx, &params, &team));
	uint64_t *v;
	urom_coll_buffer_h b;
	OK(urom_coll_mem_alloc(team, 8, (void **)&v, &b));
	*v = all->rank;
	urom_coll_req_h sum = init(team, UROM_COLL_ALLREDUCE, UROM_DT_UINT64, UROM_OP_SUM, NULL, 1,
				   b, 1, UROM_COLL_FLAG_IN_PLACE);
	OK(urom_coll_start(sum));
	OK(urom_coll_wait(sum));
	uint64_t expect = 0;
	for (uint32_t i = 0; i < all->size; i += 2)
		expect += i;
	CHECK(*v == expect, "sub-team sum %lu, expected %lu", (unsigned long)*v,
	      (unsigned long)expect);
	/* Destroyed in any order: the collective keeps what it needs. */
	OK(urom_coll_team_destroy(team));
	OK(urom_coll_mem_free(b));
	OK(urom_coll_start(sum));
	OK(urom_coll_wait(sum));
	OK(urom_coll_free(sum));
	barrier(all);
}

static void kill_worker(struct oob *oob, urom_coll_team_h team)
{
	size_t bytes = (size_t)64 << 20;
	float *data;
	urom_coll_buffer_h b;
	uint32_t pid;

	OK(urom_coll_mem_alloc(team, bytes, (void **)&data, &b));
	urom_coll_req_h sum = init(team, UROM_COLL_ALLREDUCE, UROM_DT_FLOAT32, UROM_OP_SUM, NULL,
				   bytes / 4, b, bytes / 4, UROM_COLL_FLAG_IN_PLACE);
	OK(urom_coll_set_callback(sum, on_complete, &completions));
	OK(urom_coll_start(sum));
	barrier(oob);
	OK(urom_coll_team_worker_pid(team, &pid));
	if (oob->rank == 0)
		CHECK(kill((pid_t)pid, SIGKILL) == 0, "killing the worker %u", pid);
	IS(UROM_ERR_WORKER, urom_coll_wait(sum));
	CHECK(completions == 1 && last_completion == UROM_ERR_WORKER, "completed once: %d",
	      completions);
	for (int i = 0; i < 1000; i++)
		urom_coll_test(sum);
	CHECK(completions == 1, "completed exactly once: %d", completions);
	urom_status_t again = urom_coll_start(sum);
	CHECK(again == UROM_ERR_WORKER, "a start after the worker died: %s",
	      urom_status_string(again));
	OK(urom_coll_free(sum));
	OK(urom_coll_mem_free(b));
}

static int rank_main(struct board *board, struct board *sub_board, uint32_t n, uint32_t r,
		     const char *mode)
{
	struct oob oob = { .board = board, .size = n, .rank = r };
	urom_coll_context_params_t cparams = { .oob = oob_coll(&oob), .service_socket = NULL };
	urom_coll_context_h ctx;
	urom_coll_team_h team;

	my_rank = r;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (strcmp(mode, "noservice") == 0) {
		IS(UROM_ERR_NO_SERVICE, urom_coll_context_create(&cparams, &ctx));
		CHECK(strstr(urom_coll_last_error(), "service") != NULL, "why: %s",
		      urom_coll_last_error());
		return 0;
	}
	OK(urom_coll_context_create(&cparams, &ctx));
	/* Teams get their own out-of-band collective; here, the same board. */
	urom_coll_team_params_t tparams = { .oob = oob_coll(&oob) };
	OK(urom_coll_team_create(ctx, &tparams, &team));
	if (strcmp(mode, "kill") == 0) {
		kill_worker(&oob, team);
	} else {
		collectives(&oob, team, NULL);
		subteam(&oob, ctx, sub_board);
	}
	/* Handles go in any order. */
	OK(urom_coll_context_destroy(ctx));
	OK(urom_coll_team_destroy(team));
	printf("rank %u: ok\n", r);
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 2;
	const char *mode = argc > 2 ? argv[2] : "all";
	struct board *boards;
	pid_t children[MAX_RANKS];
	int failed = 0;

	if (n < 1 || n > MAX_RANKS)
		return 2;
	boards = mmap(NULL, 2 * sizeof(struct board), PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (boards == MAP_FAILED)
		return 2;
	fflush(stdout);
	for (uint32_t r = 0; r < n; r++) {
		children[r] = fork();
		if (children[r] == 0)
			exit(rank_main(&boards[0], &boards[1], n, r, mode));
	}
	for (uint32_t r = 0; r < n; r++) {
		int status;
		waitpid(children[r], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "rank %u ended with status %d\n", r, status);
			failed = 1;
		}
	}
	if (!failed)
		printf("coll ok: %u ranks, %s\n", n, mode);
	return failed;
}
