/*
 * overlap.c - an MPI program as any MPI user writes it: each step starts an MPI_Iallreduce of
 * the gradients and an MPI_Ialltoall of the halo blocks, computes the next step meanwhile, and
 * waits for both. It knows nothing of urom; run it once as it is and once with liburom_mpi.so
 * preloaded, and compare (samples/mpi/run.sh does both):
 *
 *   mpicc -O2 -o overlap overlap.c
 *   mpirun -np 2 ./overlap
 *   mpirun -np 2 -x LD_PRELOAD=target/release/liburom_mpi.so -x UROM_MPI_VERBOSE=1 ./overlap
 *
 * Both print the same checksum (the data are small integers, so any reduction order gives the
 * same bits) and where the time went: in the compute, and waiting for the collectives.
 */
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#define STEPS 50
#define GRAD (256 * 1024)  /* floats reduced per step: 1 MiB */
#define HALO (16 * 1024)   /* ints sent to each rank per step */

/* Work that does not call MPI: as long as the collectives take, more or less. */
static double compute(float *field, int n, int rounds)
{
	double acc = 0;
	int r, i;

	for (r = 0; r < rounds; r++)
		for (i = 0; i < n; i++) {
			field[i] = field[i] * 0.999f + 0.001f * (float)(i % 7);
			acc += field[i];
		}
	return acc;
}

int main(int argc, char **argv)
{
	int rank, size, step, i;
	double t_compute = 0, t_wait = 0, t0, t1, checksum = 0, sink = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	float *grad = malloc(GRAD * sizeof(float)), *sum = malloc(GRAD * sizeof(float));
	float *field = malloc(GRAD * sizeof(float));
	int *out = malloc((size_t)size * HALO * sizeof(int)), *in = malloc((size_t)size * HALO * sizeof(int));
	for (i = 0; i < GRAD; i++)
		field[i] = 1.0f;

	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime();
	for (step = 0; step < STEPS; step++) {
		MPI_Request reqs[2];
		for (i = 0; i < GRAD; i++)
			grad[i] = (float)((rank + i + step) % 9);
		for (i = 0; i < size * HALO; i++)
			out[i] = rank * 1000 + i % HALO + step;
		MPI_Iallreduce(grad, sum, GRAD, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
		MPI_Ialltoall(out, HALO, MPI_INT, in, HALO, MPI_INT, MPI_COMM_WORLD, &reqs[1]);
		t0 = MPI_Wtime();
		sink += compute(field, GRAD, 4);
		t1 = MPI_Wtime();
		MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
		t_wait += MPI_Wtime() - t1;
		t_compute += t1 - t0;
		for (i = 0; i < GRAD; i += 97)
			checksum += sum[i];
		for (i = 0; i < size * HALO; i += 31)
			checksum += in[i];
	}
	double total = MPI_Wtime() - start;
	double all[3] = { checksum, t_compute, t_wait }, max[3];
	MPI_Reduce(all, max, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("overlap: %d ranks, %d steps: checksum %.0f; %.3f s in all, %.3f s computing, "
		       "%.3f s waiting for the collectives (slowest rank)%s\n",
		       size, STEPS, max[0], total, max[1], max[2], sink < 0 ? "!" : "");
	free(grad);
	free(sum);
	free(field);
	free(out);
	free(in);
	MPI_Finalize();
	return 0;
}
