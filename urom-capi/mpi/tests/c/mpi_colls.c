/*
 * mpi_colls.c - an MPI program that checks every collective liburom_mpi offloads against the MPI
 * library's own (PMPI_*), run with and without LD_PRELOAD=liburom_mpi.so:
 *
 *   mpi_colls all    every offloaded collective x datatype x operation, counts 0, 1 and 1000,
 *                    in place, v-variants with uneven and zero counts, on MPI_COMM_WORLD, a
 *                    split communicator (reversed rank order) and a duplicate; non-blocking
 *                    requests mixed with point-to-point ones in MPI_Waitall, MPI_Waitany,
 *                    MPI_Testall, MPI_Waitsome and MPI_Test; fallbacks (a strided derived datatype, a
 *                    user-defined operation, MINLOC) giving the same results.
 *   mpi_colls persistent   persistent collectives (MPIX_*_init) started 1,000 times and
 *                    completed through every completion call, mixed with non-persistent and
 *                    point-to-point requests; in place, zero count, a user-defined operation
 *                    (MPI's own), freed inactive and while running.
 *   mpi_colls reuse  the same MPI_Iallreduce 300 times, one rank alternating its buffers, six
 *                    in flight at once, 40 signatures.
 *   mpi_colls kill   a 64 MiB MPI_Iallreduce during which rank 0 kills the node's urom worker
 *                    (the children of $UROM_TEST_DAEMON_PID) with SIGKILL: every rank's
 *                    MPI_Wait returns MPI_ERR_OTHER; later collectives fall back to PMPI_*.
 *
 * Data are small integers, so that any reduction order gives the same bits.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

static int rank, size;
static long checks;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		checks++;                                                                  \
		if (!(cond)) {                                                             \
			fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, \
				__LINE__, #cond);                                          \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			MPI_Abort(MPI_COMM_WORLD, 2);                                      \
		}                                                                          \
	} while (0)

#define OK(call)                                                                           \
	do {                                                                               \
		int rc_ = (call);                                                          \
		CHECK(rc_ == MPI_SUCCESS, "%s returned %d", #call, rc_);                   \
	} while (0)

struct type {
	MPI_Datatype dt;
	const char *name;
	size_t size;
	int is_float;
};

static void fill(const struct type *t, void *buf, size_t count, int r, int salt)
{
	size_t i;

	for (i = 0; i < count; i++) {
		int v = (int)((r * 7 + i * 3 + (size_t)salt) % 5) + 1;
		switch (t->size) {
		case 1:
			((int8_t *)buf)[i] = (int8_t)v;
			break;
		case 2:
			((int16_t *)buf)[i] = (int16_t)v;
			break;
		case 4:
			if (t->is_float)
				((float *)buf)[i] = (float)v;
			else
				((int32_t *)buf)[i] = v;
			break;
		default:
			if (t->is_float)
				((double *)buf)[i] = (double)v;
			else
				((int64_t *)buf)[i] = v;
		}
	}
}

/* Two copies of everything: one for MPI_* (liburom_mpi when loaded), one for PMPI_*. */
struct bufs {
	char *s1, *r1, *s2, *r2;
	size_t bytes;
};

static void bufs_init(struct bufs *b, size_t bytes)
{
	b->bytes = bytes;
	b->s1 = calloc(1, bytes + 1);
	b->r1 = calloc(1, bytes + 1);
	b->s2 = calloc(1, bytes + 1);
	b->r2 = calloc(1, bytes + 1);
}

static void bufs_free(struct bufs *b)
{
	free(b->s1);
	free(b->r1);
	free(b->s2);
	free(b->r2);
}

/* Same input in both copies; receive buffers set to a pattern. */
static void bufs_fill(struct bufs *b, const struct type *t, size_t count, int salt)
{
	fill(t, b->s1, count, rank, salt);
	memcpy(b->s2, b->s1, count * t->size);
	memset(b->r1, 0x5a, b->bytes);
	memset(b->r2, 0x5a, b->bytes);
}

static void same(const struct bufs *b, size_t bytes, const char *what, const char *type,
		 const char *comm_name, int count)
{
	CHECK(memcmp(b->r1, b->r2, bytes) == 0, "%s of %d %s on %s differs from PMPI's", what,
	      count, type, comm_name);
}

static const MPI_Op ops[] = { MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX, MPI_BAND,
			      MPI_BOR, MPI_BXOR, MPI_LAND, MPI_LOR, MPI_LXOR };

static void reductions(MPI_Comm comm, const char *name, const struct type *t, int count)
{
	int n, me, i, o;
	struct bufs b;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	bufs_init(&b, (size_t)(count > 0 ? count : 1) * t->size * (size_t)n);
	for (o = 0; o < (t->is_float ? 4 : 10); o++) {
		MPI_Op op = ops[o];
		size_t bytes = (size_t)count * t->size;
		MPI_Request req;

		bufs_fill(&b, t, (size_t)count * (size_t)n, o);
		OK(MPI_Allreduce(b.s1, b.r1, count, t->dt, op, comm));
		OK(PMPI_Allreduce(b.s2, b.r2, count, t->dt, op, comm));
		same(&b, bytes, "MPI_Allreduce", t->name, name, count);

		bufs_fill(&b, t, (size_t)count * (size_t)n, o + 1);
		memcpy(b.r1, b.s1, bytes);
		memcpy(b.r2, b.s2, bytes);
		OK(MPI_Iallreduce(MPI_IN_PLACE, b.r1, count, t->dt, op, comm, &req));
		OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
		OK(PMPI_Allreduce(MPI_IN_PLACE, b.r2, count, t->dt, op, comm));
		same(&b, bytes, "in-place MPI_Iallreduce", t->name, name, count);

		bufs_fill(&b, t, (size_t)count * (size_t)n, o + 2);
		OK(MPI_Reduce(b.s1, b.r1, count, t->dt, op, n - 1, comm));
		OK(PMPI_Reduce(b.s2, b.r2, count, t->dt, op, n - 1, comm));
		if (me == n - 1)
			same(&b, bytes, "MPI_Reduce", t->name, name, count);
		bufs_fill(&b, t, (size_t)count * (size_t)n, o + 3);
		if (me == 0) {
			memcpy(b.r1, b.s1, bytes);
			memcpy(b.r2, b.s2, bytes);
		}
		OK(MPI_Ireduce(me == 0 ? MPI_IN_PLACE : b.s1, b.r1, count, t->dt, op, 0, comm, &req));
		OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
		OK(PMPI_Reduce(me == 0 ? MPI_IN_PLACE : b.s2, b.r2, count, t->dt, op, 0, comm));
		if (me == 0)
			same(&b, bytes, "in-place MPI_Ireduce", t->name, name, count);

		bufs_fill(&b, t, (size_t)count * (size_t)n, o + 4);
		OK(MPI_Reduce_scatter_block(b.s1, b.r1, count, t->dt, op, comm));
		OK(PMPI_Reduce_scatter_block(b.s2, b.r2, count, t->dt, op, comm));
		same(&b, bytes, "MPI_Reduce_scatter_block", t->name, name, count);
		bufs_fill(&b, t, (size_t)count * (size_t)n, o + 5);
		memcpy(b.r1, b.s1, bytes * (size_t)n);
		memcpy(b.r2, b.s2, bytes * (size_t)n);
		OK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, b.r1, count, t->dt, op, comm, &req));
		OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
		OK(PMPI_Reduce_scatter_block(MPI_IN_PLACE, b.r2, count, t->dt, op, comm));
		same(&b, bytes, "in-place MPI_Ireduce_scatter_block", t->name, name, count);
	}
	bufs_free(&b);
	(void)i;
}

static void movements(MPI_Comm comm, const char *name, const struct type *t, int count)
{
	int n, me, i;
	struct bufs b;
	MPI_Request req;

	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &me);
	size_t block = (size_t)count * t->size, all = block * (size_t)n;
	bufs_init(&b, all > 0 ? all : 1);

	bufs_fill(&b, t, (size_t)count * (size_t)n, 11);
	memcpy(b.r1, b.s1, block);
	memcpy(b.r2, b.s2, block);
	OK(MPI_Bcast(b.r1, count, t->dt, 1 % n, comm));
	OK(PMPI_Bcast(b.r2, count, t->dt, 1 % n, comm));
	same(&b, block, "MPI_Bcast", t->name, name, count);
	bufs_fill(&b, t, (size_t)count * (size_t)n, 12);
	memcpy(b.r1, b.s1, block);
	memcpy(b.r2, b.s2, block);
	OK(MPI_Ibcast(b.r1, count, t->dt, 0, comm, &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	OK(PMPI_Bcast(b.r2, count, t->dt, 0, comm));
	same(&b, block, "MPI_Ibcast", t->name, name, count);

	bufs_fill(&b, t, (size_t)count * (size_t)n, 13);
	OK(MPI_Allgather(b.s1, count, t->dt, b.r1, count, t->dt, comm));
	OK(PMPI_Allgather(b.s2, count, t->dt, b.r2, count, t->dt, comm));
	same(&b, all, "MPI_Allgather", t->name, name, count);
	bufs_fill(&b, t, (size_t)count * (size_t)n, 14);
	memcpy(b.r1 + block * (size_t)me, b.s1, block);
	memcpy(b.r2 + block * (size_t)me, b.s2, block);
	OK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.r1, count, t->dt, comm, &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	OK(PMPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.r2, count, t->dt, comm));
	same(&b, all, "in-place MPI_Iallgather", t->name, name, count);

	bufs_fill(&b, t, (size_t)count * (size_t)n, 15);
	OK(MPI_Alltoall(b.s1, count, t->dt, b.r1, count, t->dt, comm));
	OK(PMPI_Alltoall(b.s2, count, t->dt, b.r2, count, t->dt, comm));
	same(&b, all, "MPI_Alltoall", t->name, name, count);
	bufs_fill(&b, t, (size_t)count * (size_t)n, 16);
	memcpy(b.r1, b.s1, all);
	memcpy(b.r2, b.s2, all);
	OK(MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.r1, count, t->dt, comm, &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	OK(PMPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.r2, count, t->dt, comm));
	same(&b, all, "in-place MPI_Ialltoall", t->name, name, count);

	/* v-variants: rank i sends (count + i) % 3 elements (zeros among them), laid out with a
	 * gap of one element. */
	int *counts = calloc((size_t)n, sizeof(int)), *displs = calloc((size_t)n, sizeof(int));
	int *sc = calloc((size_t)n, sizeof(int)), *sd = calloc((size_t)n, sizeof(int));
	int end = 0;
	for (i = 0; i < n; i++) {
		counts[i] = (count + i) % 3;
		displs[i] = end;
		end += counts[i] + 1;
	}
	struct bufs v;
	bufs_init(&v, (size_t)(end + 1) * t->size * (size_t)n);
	bufs_fill(&v, t, (size_t)(end + 1), 17);
	OK(MPI_Allgatherv(v.s1, counts[me], t->dt, v.r1, counts, displs, t->dt, comm));
	OK(PMPI_Allgatherv(v.s2, counts[me], t->dt, v.r2, counts, displs, t->dt, comm));
	same(&v, (size_t)end * t->size, "MPI_Allgatherv", t->name, name, count);
	bufs_fill(&v, t, (size_t)(end + 1), 18);
	memcpy(v.r1 + (size_t)displs[me] * t->size, v.s1, (size_t)counts[me] * t->size);
	memcpy(v.r2 + (size_t)displs[me] * t->size, v.s2, (size_t)counts[me] * t->size);
	OK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.r1, counts, displs, t->dt, comm,
			   &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	OK(PMPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.r2, counts, displs, t->dt, comm));
	same(&v, (size_t)end * t->size, "in-place MPI_Iallgatherv", t->name, name, count);
	/* Alltoallv: rank me sends (me + j + count) % 3 to j; receives (j + me + count) % 3. */
	int send_end = 0, recv_end = 0;
	for (i = 0; i < n; i++) {
		sc[i] = (me + i + count) % 3;
		sd[i] = send_end;
		send_end += sc[i] + 1;
		counts[i] = (i + me + count) % 3;
		displs[i] = recv_end;
		recv_end += counts[i] + 1;
	}
	bufs_fill(&v, t, (size_t)send_end, 19);
	OK(MPI_Alltoallv(v.s1, sc, sd, t->dt, v.r1, counts, displs, t->dt, comm));
	OK(PMPI_Alltoallv(v.s2, sc, sd, t->dt, v.r2, counts, displs, t->dt, comm));
	same(&v, (size_t)recv_end * t->size, "MPI_Alltoallv", t->name, name, count);
	bufs_fill(&v, t, (size_t)send_end, 20);
	OK(MPI_Ialltoallv(v.s1, sc, sd, t->dt, v.r1, counts, displs, t->dt, comm, &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	OK(PMPI_Alltoallv(v.s2, sc, sd, t->dt, v.r2, counts, displs, t->dt, comm));
	same(&v, (size_t)recv_end * t->size, "MPI_Ialltoallv", t->name, name, count);
	bufs_free(&v);
	free(counts);
	free(displs);
	free(sc);
	free(sd);

	OK(MPI_Barrier(comm));
	OK(MPI_Ibarrier(comm, &req));
	OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
	bufs_free(&b);
}

static const struct type types[] = {
	{ MPI_INT8_T, "int8", 1, 0 },	  { MPI_UINT8_T, "uint8", 1, 0 },
	{ MPI_SHORT, "short", 2, 0 },	  { MPI_UINT16_T, "uint16", 2, 0 },
	{ MPI_INT, "int", 4, 0 },	  { MPI_UNSIGNED, "unsigned", 4, 0 },
	{ MPI_LONG, "long", 8, 0 },	  { MPI_UINT64_T, "uint64", 8, 0 },
	{ MPI_FLOAT, "float", 4, 1 },	  { MPI_DOUBLE, "double", 8, 1 },
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

static void suite(MPI_Comm comm, const char *name)
{
	const int counts[] = { 0, 1, 1000 };
	size_t t;
	int c;

	for (t = 0; t < NTYPES; t++)
		for (c = 0; c < 3; c++) {
			reductions(comm, name, &types[t], counts[c]);
			if (types[t].size == 4 || types[t].size == 1)
				movements(comm, name, &types[t], counts[c]);
		}
}

/* Non-blocking collectives mixed with point-to-point requests. */
static void mixed(void)
{
	const int big = 100000; /* beyond the eager limit: the point-to-point needs progress */
	int *ring_out = malloc(big * sizeof(int)), *ring_in = malloc(big * sizeof(int));
	int *x = malloc(1000 * sizeof(int)), *y = malloc(1000 * sizeof(int));
	int *a = malloc((size_t)size * 10 * sizeof(int)), *b = malloc((size_t)size * 10 * sizeof(int));
	int i, j, round;
	MPI_Request reqs[4];
	MPI_Status st[4];
	int expect_sum = size * (size - 1) / 2;

	for (round = 0; round < 20; round++) {
		for (i = 0; i < big; i++)
			ring_out[i] = rank * 1000 + i + round;
		for (i = 0; i < 1000; i++)
			x[i] = rank + i;
		for (i = 0; i < size * 10; i++)
			a[i] = rank * 100000 + i;
		OK(MPI_Irecv(ring_in, big, MPI_INT, (rank + size - 1) % size, 7, MPI_COMM_WORLD, &reqs[0]));
		OK(MPI_Iallreduce(x, y, 1000, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[1]));
		OK(MPI_Isend(ring_out, big, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD, &reqs[2]));
		OK(MPI_Ialltoall(a, 10, MPI_INT, b, 10, MPI_INT, MPI_COMM_WORLD, &reqs[3]));
		if (round % 4 == 0) {
			OK(MPI_Waitall(4, reqs, st));
		} else if (round % 4 == 1) {
			int left = 4, index;
			while (left > 0) {
				OK(MPI_Waitany(4, reqs, &index, &st[0]));
				CHECK(index >= 0 && index < 4, "Waitany index %d", index);
				left--;
			}
			OK(MPI_Waitany(4, reqs, &index, &st[0]));
			CHECK(index == MPI_UNDEFINED, "all done: %d", index);
		} else if (round % 4 == 2) {
			int flag = 0;
			while (!flag)
				OK(MPI_Testall(4, reqs, &flag, st));
		} else {
			int outcount, idx[4], left = 4;
			while (left > 0) {
				OK(MPI_Waitsome(4, reqs, &outcount, idx, st));
				left -= outcount;
			}
		}
		for (i = 0; i < big; i++)
			CHECK(ring_in[i] == ((rank + size - 1) % size) * 1000 + i + round, "ring %d", i);
		for (i = 0; i < 1000; i++)
			CHECK(y[i] == expect_sum + size * i, "Iallreduce %d: %d", i, y[i]);
		for (j = 0; j < size; j++)
			for (i = 0; i < 10; i++)
				CHECK(b[j * 10 + i] == j * 100000 + rank * 10 + i, "Ialltoall");
	}
	/* MPI_Test polling. */
	int flag = 0;
	OK(MPI_Ibarrier(MPI_COMM_WORLD, &reqs[0]));
	while (!flag)
		OK(MPI_Test(&reqs[0], &flag, MPI_STATUS_IGNORE));
	free(ring_out);
	free(ring_in);
	free(x);
	free(y);
	free(a);
	free(b);
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	int i;

	(void)dt;
	for (i = 0; i < *len; i++)
		((int *)inout)[i] += ((int *)in)[i];
}

/* What urom cannot do goes to PMPI_* with the same results. */
static void fallbacks(void)
{
	MPI_Datatype strided;
	MPI_Op op;
	int i, in[200], out1[200], out2[200];
	struct {
		int v, r;
	} pin = { rank % 2, rank }, pout1, pout2;

	OK(MPI_Type_vector(100, 1, 2, MPI_INT, &strided));
	OK(MPI_Type_commit(&strided));
	for (i = 0; i < 200; i++)
		out1[i] = out2[i] = rank == 0 ? i : -1;
	OK(MPI_Bcast(out1, 1, strided, 0, MPI_COMM_WORLD));
	OK(PMPI_Bcast(out2, 1, strided, 0, MPI_COMM_WORLD));
	CHECK(memcmp(out1, out2, sizeof(out1)) == 0, "strided bcast");
	OK(MPI_Type_free(&strided));

	OK(MPI_Op_create(user_sum, 1, &op));
	for (i = 0; i < 200; i++)
		in[i] = rank + i;
	OK(MPI_Allreduce(in, out1, 200, MPI_INT, op, MPI_COMM_WORLD));
	OK(PMPI_Allreduce(in, out2, 200, MPI_INT, op, MPI_COMM_WORLD));
	CHECK(memcmp(out1, out2, sizeof(out1)) == 0, "user-op allreduce");
	OK(MPI_Op_free(&op));

	OK(MPI_Allreduce(&pin, &pout1, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD));
	OK(PMPI_Allreduce(&pin, &pout2, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD));
	CHECK(pout1.v == pout2.v && pout1.r == pout2.r, "MINLOC");
}

/* Kills the children of $UROM_TEST_DAEMON_PID: the daemon's workers. */
/* The persistent collectives (Open MPI's MPIX_*_init): started 1,000 times, completed by every
 * completion call, mixed with non-persistent and point-to-point requests, freed inactive and
 * active; results compared with PMPI_*'s. */
static void persistent(void)
{
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
	const int n = 1000, rounds = 1000, root = size - 1, ring = 20000;
	int *x = calloc(n, sizeof(int)), *y = calloc(n, sizeof(int)), *yref = calloc(n, sizeof(int));
	int *x2 = calloc(n, sizeof(int)), *y2 = calloc(n, sizeof(int));
	int *a = calloc((size_t)size * 8, sizeof(int)), *b = calloc((size_t)size * 8, sizeof(int));
	int *bref = malloc((size_t)size * 8 * sizeof(int));
	int *gs = calloc(4, sizeof(int)), *gr = calloc((size_t)size * 4, sizeof(int));
	int *gref = malloc((size_t)size * 4 * sizeof(int)), bc[64];
	int *ring_out = malloc(ring * sizeof(int)), *ring_in = malloc(ring * sizeof(int));
	int i, k, round, done, index, outcount, idx[8], flag;
	MPI_Request p[8];
	MPI_Status st[8];

	OK(MPIX_Allreduce_init(x, y, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &p[0]));
	OK(MPIX_Alltoall_init(a, 8, MPI_INT, b, 8, MPI_INT, MPI_COMM_WORLD, MPI_INFO_NULL, &p[1]));
	OK(MPIX_Bcast_init(bc, 64, MPI_INT, root, MPI_COMM_WORLD, MPI_INFO_NULL, &p[2]));
	OK(MPIX_Allgather_init(gs, 4, MPI_INT, gr, 4, MPI_INT, MPI_COMM_WORLD, MPI_INFO_NULL, &p[3]));
	OK(MPIX_Barrier_init(MPI_COMM_WORLD, MPI_INFO_NULL, &p[4]));
	/* Inactive: completes at once, the handle stays. */
	OK(MPI_Wait(&p[0], &st[0]));
	CHECK(p[0] != MPI_REQUEST_NULL, "an inactive persistent request stays");
	OK(MPI_Test(&p[1], &flag, MPI_STATUS_IGNORE));
	CHECK(flag && p[1] != MPI_REQUEST_NULL, "an inactive persistent request tests complete");
	for (round = 0; round < rounds; round++) {
		for (i = 0; i < n; i++)
			x[i] = rank + i + round;
		for (i = 0; i < size * 8; i++)
			a[i] = rank * 1000 + i + round;
		for (i = 0; i < 64; i++)
			bc[i] = rank == root ? round * 3 + i : -1;
		for (i = 0; i < 4; i++)
			gs[i] = rank * 10 + i + round;
		switch (round % 5) {
		case 0:
			OK(MPI_Startall(5, p));
			OK(MPI_Waitall(5, p, st));
			break;
		case 1:
			for (k = 0; k < 5; k++)
				OK(MPI_Start(&p[k]));
			for (k = 4; k >= 0; k--)
				OK(MPI_Wait(&p[k], &st[k]));
			break;
		case 2:
			/* With a non-persistent collective and a point-to-point ring, in MPI_Waitany. */
			for (i = 0; i < n; i++)
				x2[i] = rank * 2 + i;
			for (i = 0; i < ring; i++)
				ring_out[i] = rank + i + round;
			OK(MPI_Irecv(ring_in, ring, MPI_INT, (rank + size - 1) % size, 9, MPI_COMM_WORLD,
				     &p[5]));
			OK(MPI_Startall(5, p));
			OK(MPI_Iallreduce(x2, y2, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &p[6]));
			OK(MPI_Isend(ring_out, ring, MPI_INT, (rank + 1) % size, 9, MPI_COMM_WORLD, &p[7]));
			for (done = 0;; done++) {
				OK(MPI_Waitany(8, p, &index, &st[0]));
				if (index == MPI_UNDEFINED)
					break;
				CHECK(index < 5 ? p[index] != MPI_REQUEST_NULL : p[index] == MPI_REQUEST_NULL,
				      "Waitany: request %d", index);
			}
			CHECK(done == 8, "Waitany completed %d of 8", done);
			for (i = 0; i < n; i++)
				CHECK(y2[i] == (size - 1) * 2 + i, "Iallreduce max %d: %d", i, y2[i]);
			for (i = 0; i < ring; i++)
				CHECK(ring_in[i] == (rank + size - 1) % size + i + round, "ring %d", i);
			break;
		case 3:
			OK(MPI_Startall(5, p));
			for (flag = 0; !flag;)
				OK(MPI_Testall(5, p, &flag, st));
			break;
		default:
			OK(MPI_Startall(5, p));
			for (done = 0;; done += outcount) {
				OK(MPI_Waitsome(5, p, &outcount, idx, st));
				if (outcount == MPI_UNDEFINED)
					break;
				for (k = 0; k < outcount; k++)
					CHECK(idx[k] >= 0 && idx[k] < 5, "Waitsome index %d", idx[k]);
			}
			CHECK(done == 5, "Waitsome completed %d of 5", done);
			break;
		}
		for (k = 0; k < 5; k++)
			CHECK(p[k] != MPI_REQUEST_NULL, "persistent request %d stays", k);
		OK(PMPI_Allreduce(x, yref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		CHECK(!memcmp(y, yref, n * sizeof(int)), "persistent allreduce, round %d", round);
		OK(PMPI_Alltoall(a, 8, MPI_INT, bref, 8, MPI_INT, MPI_COMM_WORLD));
		CHECK(!memcmp(b, bref, (size_t)size * 8 * sizeof(int)), "persistent alltoall, round %d",
		      round);
		for (i = 0; i < 64; i++)
			CHECK(bc[i] == round * 3 + i, "persistent bcast %d: %d", i, bc[i]);
		OK(PMPI_Allgather(gs, 4, MPI_INT, gref, 4, MPI_INT, MPI_COMM_WORLD));
		CHECK(!memcmp(gr, gref, (size_t)size * 4 * sizeof(int)), "persistent allgather");
	}
	/* In place, and a zero count. */
	MPI_Request q, z;
	OK(MPIX_Allreduce_init(MPI_IN_PLACE, y, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL,
			       &q));
	OK(MPIX_Allreduce_init(x, y2, 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &z));
	for (round = 0; round < 10; round++) {
		for (i = 0; i < n; i++)
			y[i] = yref[i] = rank * round + i;
		OK(MPI_Start(&q));
		OK(MPI_Start(&z));
		OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
		OK(MPI_Wait(&z, MPI_STATUS_IGNORE));
		OK(PMPI_Allreduce(MPI_IN_PLACE, yref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		CHECK(!memcmp(y, yref, n * sizeof(int)), "in-place persistent allreduce");
	}
	OK(MPI_Request_free(&q));
	OK(MPI_Request_free(&z));
	CHECK(q == MPI_REQUEST_NULL && z == MPI_REQUEST_NULL, "freed");
	/* A user-defined operation: MPI's own persistent collective, through the same calls. */
	MPI_Op mine;
	OK(MPI_Op_create(user_sum, 1, &mine));
	OK(MPIX_Allreduce_init(x, y2, n, MPI_INT, mine, MPI_COMM_WORLD, MPI_INFO_NULL, &q));
	for (round = 0; round < 3; round++) {
		for (i = 0; i < n; i++)
			x[i] = rank + i * round;
		OK(MPI_Start(&q));
		OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
		OK(PMPI_Allreduce(x, yref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		CHECK(!memcmp(y2, yref, n * sizeof(int)), "persistent user-op allreduce");
	}
	OK(MPI_Request_free(&q));
	OK(MPI_Op_free(&mine));
	/* Freed while it runs: the collective still completes (before the barrier after it).
	 * Open MPI alone refuses to free an active collective request: with the library only. */
	const char *preload = getenv("LD_PRELOAD");
	if (preload != NULL && strstr(preload, "urom_mpi") != NULL) {
		for (i = 0; i < n; i++)
			x[i] = rank * 3 + i;
		OK(MPI_Start(&p[0]));
		OK(MPI_Request_free(&p[0]));
		CHECK(p[0] == MPI_REQUEST_NULL, "freed while active");
		OK(MPI_Barrier(MPI_COMM_WORLD));
		OK(PMPI_Allreduce(x, yref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		CHECK(!memcmp(y, yref, n * sizeof(int)), "allreduce freed while active");
	} else {
		OK(MPI_Request_free(&p[0]));
	}
	for (k = 1; k < 5; k++)
		OK(MPI_Request_free(&p[k]));
	free(x);
	free(y);
	free(yref);
	free(x2);
	free(y2);
	free(a);
	free(b);
	free(bref);
	free(gs);
	free(gr);
	free(gref);
	free(ring_out);
	free(ring_in);
#else
	if (rank == 0)
		printf("no MPIX_*_init in this MPI: persistent mode checks nothing\n");
#endif
}

/* Repeated non-blocking collectives: the set-up collective reused, a rank whose buffers change
 * alone (rank 0 alternates two), more in flight at once than the cache keeps per signature,
 * and more signatures than it keeps. */
static void reuse(void)
{
	const int n = 4096;
	int *x[2], *y[2], *ref = malloc(n * sizeof(int)), *xs[6], *ys[6];
	int i, j, round;
	MPI_Request reqs[6];

	for (j = 0; j < 2; j++) {
		x[j] = malloc(n * sizeof(int));
		y[j] = malloc(n * sizeof(int));
	}
	for (j = 0; j < 6; j++) {
		xs[j] = malloc(n * sizeof(int));
		ys[j] = malloc(n * sizeof(int));
	}
	for (round = 0; round < 300; round++) {
		int b = rank == 0 ? round % 2 : 0;
		for (i = 0; i < n; i++)
			x[b][i] = rank * 7 + i + round;
		OK(MPI_Iallreduce(x[b], y[b], n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]));
		OK(MPI_Wait(&reqs[0], MPI_STATUS_IGNORE));
		OK(PMPI_Allreduce(x[b], ref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
		CHECK(!memcmp(y[b], ref, n * sizeof(int)), "reused Iallreduce, round %d", round);
		if (round % 50 == 0) {
			/* Six of one signature in flight. */
			for (j = 0; j < 6; j++) {
				for (i = 0; i < n; i++)
					xs[j][i] = rank + i * j + round;
				OK(MPI_Iallreduce(xs[j], ys[j], n, MPI_INT, MPI_SUM, MPI_COMM_WORLD,
						  &reqs[j]));
			}
			OK(MPI_Waitall(6, reqs, MPI_STATUSES_IGNORE));
			for (j = 0; j < 6; j++) {
				OK(PMPI_Allreduce(xs[j], ref, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
				CHECK(!memcmp(ys[j], ref, n * sizeof(int)), "in flight %d", j);
			}
		}
		if (round % 100 == 0) {
			/* 40 signatures (counts), more than the cache keeps. */
			for (j = 1; j <= 40; j++) {
				for (i = 0; i < j; i++)
					x[0][i] = rank + i + j;
				OK(MPI_Allreduce(x[0], y[0], j, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
				OK(PMPI_Allreduce(x[0], ref, j, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
				CHECK(!memcmp(y[0], ref, (size_t)j * sizeof(int)), "count %d", j);
			}
		}
	}
	for (j = 0; j < 2; j++) {
		free(x[j]);
		free(y[j]);
	}
	for (j = 0; j < 6; j++) {
		free(xs[j]);
		free(ys[j]);
	}
	free(ref);
}

static int kill_workers(void)
{
	const char *daemon = getenv("UROM_TEST_DAEMON_PID");
	DIR *proc = opendir("/proc");
	struct dirent *e;
	int killed = 0;

	if (daemon == NULL || proc == NULL)
		return 0;
	while ((e = readdir(proc)) != NULL) {
		char path[300], buf[512];
		FILE *f;
		int pid = atoi(e->d_name), ppid = 0;
		if (pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		if (fgets(buf, sizeof(buf), f) != NULL) {
			char *p = strrchr(buf, ')');
			if (p != NULL)
				sscanf(p + 2, "%*c %d", &ppid);
		}
		fclose(f);
		if (ppid == atoi(daemon) && kill(pid, SIGKILL) == 0)
			killed++;
	}
	closedir(proc);
	return killed;
}

static void kill_mode(void)
{
	const size_t n = (size_t)16 << 20; /* 64 MiB of floats */
	float *data = malloc(n * sizeof(float));
	MPI_Request req;
	MPI_Status status;
	size_t i;
	int rc, x = rank, y = 0;

	OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
	for (i = 0; i < n; i++)
		data[i] = 1.0f;
	/* Warm up: the team forms and the buffer is registered. */
	OK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
	OK(MPI_Iallreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req));
	OK(PMPI_Barrier(MPI_COMM_WORLD)); /* every rank started it */
	if (rank == 0)
		CHECK(kill_workers() > 0, "no worker of the daemon to kill");
	rc = MPI_Wait(&req, &status);
	CHECK(rc == MPI_ERR_OTHER, "MPI_Wait after the worker died returned %d", rc);
	CHECK(status.MPI_ERROR == MPI_ERR_OTHER, "status %d", status.MPI_ERROR);
	CHECK(req == MPI_REQUEST_NULL, "the request was released");
	/* Later collectives fall back to PMPI_*. */
	x = rank;
	OK(MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
	CHECK(y == size * (size - 1) / 2, "fallback allreduce %d", y);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	free(data);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "all";
	MPI_Comm split, dup;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (strcmp(mode, "kill") == 0) {
		kill_mode();
	} else if (strcmp(mode, "persistent") == 0) {
		persistent();
	} else if (strcmp(mode, "reuse") == 0) {
		reuse();
	} else {
		suite(MPI_COMM_WORLD, "MPI_COMM_WORLD");
		OK(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, size - rank, &split));
		suite(split, "a split communicator");
		OK(MPI_Comm_free(&split));
		OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
		reductions(dup, "a duplicate", &types[4], 1000);
		OK(MPI_Comm_free(&dup));
		mixed();
		fallbacks();
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));
	printf("rank %d: %s ok (%ld checks)\n", rank, mode, checks);
	MPI_Finalize();
	return 0;
}
