/*
 * doca_urom.h - the host API of DOCA UROM, in urom: services, workers and their tasks, domains.
 *
 * A service is the connection to urom-daemon; a worker is a process the daemon runs plugins
 * in; a domain makes workers of several hosts (ranks) a team whose plugins find each other.
 * All three are contexts (doca_ctx.h) connected to a progress engine (doca_pe.h):
 *
 *   - service: create, set max workers / message size / device, doca_ctx_start() (connects at
 *     once: DOCA_SUCCESS and running), get its plugins and CPUs, query workers by group with a
 *     task, doca_ctx_stop() (at once), destroy (idle only: DOCA_ERROR_NOT_PERMITTED otherwise).
 *   - worker: create, set service / id / group / plugins / CPUs / environment / max in-flight
 *     tasks, doca_ctx_start() (DOCA_ERROR_IN_PROGRESS: doca_pe_progress() brings it to running,
 *     or back to idle if the daemon refuses or the worker fails), command tasks, doca_ctx_stop()
 *     (DOCA_ERROR_IN_PROGRESS, stopping: the next progress completes tasks in flight with
 *     DOCA_ERROR_SHUTDOWN and asks the daemon to destroy the worker; a later progress makes it
 *     idle once the daemon has answered, and no progress waits for that answer), destroy.
 *     A running worker that fails (its process ended or killed, its channel broken) completes
 *     its tasks in flight with DOCA_ERROR_NOT_CONNECTED and its context goes RUNNING ->
 *     STOPPING -> IDLE from progress, each change reported by the state-changed callback; it
 *     may then start again.
 *   - domain: create, set the out-of-band collective / workers with their domain ids / buffer
 *     count / buffers, doca_ctx_start() (DOCA_ERROR_IN_PROGRESS: doca_pe_progress() exchanges
 *     every rank's workers and buffers through the collective and brings it to running, or back
 *     to idle if the start failed), doca_ctx_stop() (at once), destroy (idle only).
 *
 * Setters need an idle context (DOCA_ERROR_BAD_STATE); NULL arguments give
 * DOCA_ERROR_INVALID_VALUE. Callbacks run from doca_pe_progress() of the context's engine.
 *
 * Which service: DOCA_UROM_SERVICE_FILE names the service of this host (and, once
 * doca_urom_service_set_dev() picked a device, of that device's line); a service on this host is
 * reached at its default socket, or at the socket named by UROM_SERVICE_SOCKET. Why a service,
 * worker or domain did not start is logged to the SDK log backends (doca_log.h).
 */
#ifndef DOCA_UROM_H_
#define DOCA_UROM_H_

#include <stddef.h>
#include <stdint.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_urom_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU sets are UCX's: its header where UCX is installed, the same layout otherwise. */
#if defined(__has_include)
#if __has_include(<ucs/type/cpu_set.h>) && !defined(UROM_OWN_UCS_CPU_SET)
#include <ucs/type/cpu_set.h>
#endif
#endif
#ifndef UCS_TYPE_CPU_SET_H
#define UCS_TYPE_CPU_SET_H
typedef unsigned long int ucs_cpu_mask_t;
#define UCS_CPU_SETSIZE 1024
#define UCS_NCPUBITS (8 * sizeof(ucs_cpu_mask_t))
#define UCS_CPUELT(_cpu) ((_cpu) / UCS_NCPUBITS)
#define UCS_CPUMASK(_cpu) ((ucs_cpu_mask_t)1 << ((_cpu) % UCS_NCPUBITS))
typedef struct {
	ucs_cpu_mask_t ucs_bits[UCS_CPU_SETSIZE / 64];
} ucs_cpu_set_t;
#define UCS_CPU_ZERO(_cpusetp)                                              \
	do {                                                                \
		size_t _i;                                                  \
		for (_i = 0; _i < UCS_CPU_SETSIZE / UCS_NCPUBITS; ++_i)     \
			(_cpusetp)->ucs_bits[_i] = 0;                       \
	} while (0)
#define UCS_CPU_SET(_cpu, _cpusetp)                                         \
	do {                                                                \
		size_t _cpu2 = (_cpu);                                      \
		if (_cpu2 < UCS_CPU_SETSIZE)                                \
			(_cpusetp)->ucs_bits[UCS_CPUELT(_cpu2)] |= UCS_CPUMASK(_cpu2); \
	} while (0)
static inline int ucs_cpu_is_set(int cpu, const ucs_cpu_set_t *cpusetp)
{
	return cpu >= 0 && cpu < UCS_CPU_SETSIZE &&
	       (cpusetp->ucs_bits[UCS_CPUELT((size_t)cpu)] & UCS_CPUMASK((size_t)cpu)) != 0;
}
#endif
typedef ucs_cpu_set_t doca_cpu_set_t;
#define DOCA_CPU_ZERO(_cpusetp) UCS_CPU_ZERO(_cpusetp)
#define DOCA_CPU_SET(_cpu, _cpusetp) UCS_CPU_SET(_cpu, _cpusetp)
#define doca_cpu_is_set(_cpu, _cpusetp) ucs_cpu_is_set(_cpu, _cpusetp)

struct doca_buf;
struct doca_ctx;
struct doca_dev;
struct doca_task;

/* Services. */

struct doca_urom_service;
struct doca_urom_service_get_workers_by_gid_task;

/* Runs from doca_pe_progress() when a workers-by-gid query completes. */
typedef void (*doca_urom_service_get_workers_by_gid_task_completion_cb_t)(
	struct doca_urom_service_get_workers_by_gid_task *task,
	union doca_data task_user_data,
	union doca_data ctx_user_data);

DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_create(struct doca_urom_service **service_ctx);

/* Idle (DOCA_ERROR_NOT_PERMITTED otherwise) and no query in flight (DOCA_ERROR_IN_USE); frees
 * its tasks. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_destroy(struct doca_urom_service *service_ctx);

/* The largest frame on every channel, headers included (184 to 16 MiB, default 4096); the
 * daemon must use the same (its -m). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_set_max_comm_msg_size(struct doca_urom_service *service_ctx, size_t msg_size);

/* The most workers this host runs through the service at once; a power of two (default 64). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_set_max_workers(struct doca_urom_service *service_ctx, uint32_t max_workers);

/* The device (doca_dev.h) whose line of DOCA_UROM_SERVICE_FILE names the service. Optional: without
 * one, the first line of this host, or the default socket when there is no file. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_set_dev(struct doca_urom_service *service_ctx, struct doca_dev *dev);

DOCA_EXPERIMENTAL
struct doca_ctx *doca_urom_service_as_ctx(struct doca_urom_service *service_ctx);

/* The plugins the service offers (running only: DOCA_ERROR_BAD_STATE; none: DOCA_ERROR_NOT_FOUND);
 * the array stays valid until the service stops. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_get_plugins_list(struct doca_urom_service *service_ctx,
						const struct doca_urom_service_plugin_info **plugins,
						size_t *plugins_count);

/* The CPUs workers may use (running only). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_get_cpuset(struct doca_urom_service *service_ctx, doca_cpu_set_t *cpuset);

/* A query for the workers of a group (running only: DOCA_ERROR_BAD_STATE). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_get_workers_by_gid_task_allocate(struct doca_urom_service *service_ctx,
								struct doca_urom_service_get_workers_by_gid_task **task);

DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_get_workers_by_gid_task_allocate_init(
	struct doca_urom_service *service_ctx,
	uint32_t gid,
	doca_urom_service_get_workers_by_gid_task_completion_cb_t cb,
	struct doca_urom_service_get_workers_by_gid_task **task);

/* Not while in flight (DOCA_ERROR_NOT_PERMITTED). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_service_get_workers_by_gid_task_release(struct doca_urom_service_get_workers_by_gid_task *task);

DOCA_EXPERIMENTAL
void doca_urom_service_get_workers_by_gid_task_set_gid(struct doca_urom_service_get_workers_by_gid_task *task,
						       uint32_t gid);

DOCA_EXPERIMENTAL
void doca_urom_service_get_workers_by_gid_task_set_cb(struct doca_urom_service_get_workers_by_gid_task *task,
						      doca_urom_service_get_workers_by_gid_task_completion_cb_t cb);

DOCA_EXPERIMENTAL
struct doca_task *doca_urom_service_get_workers_by_gid_task_as_task(
	struct doca_urom_service_get_workers_by_gid_task *task);

/* The answer, valid until the task is submitted again or released. */
DOCA_EXPERIMENTAL
size_t doca_urom_service_get_workers_by_gid_task_get_workers_count(
	struct doca_urom_service_get_workers_by_gid_task *task);

DOCA_EXPERIMENTAL
const uint64_t *doca_urom_service_get_workers_by_gid_task_get_worker_ids(
	struct doca_urom_service_get_workers_by_gid_task *task);

/* Workers. */

struct doca_urom_worker;
struct doca_urom_worker_cmd_task;

/* Runs from doca_pe_progress() when a command completes: with the plugin's notification in the
 * response buffer, or with DOCA_ERROR_SHUTDOWN (stopped) or DOCA_ERROR_NOT_CONNECTED (the worker
 * or its channel failed) as the task's status. */
typedef void (*doca_urom_worker_cmd_task_completion_cb_t)(struct doca_urom_worker_cmd_task *task,
							  union doca_data task_user_data,
							  union doca_data ctx_user_data);

/* Any id: the service picks a fresh one. */
#define DOCA_UROM_WORKER_ID_ANY -1ULL

DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_create(struct doca_urom_worker **worker_ctx);

/* Idle only (DOCA_ERROR_NOT_PERMITTED otherwise); frees its command tasks. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_destroy(struct doca_urom_worker *worker_ctx);

/* The service must run when the worker starts (DOCA_ERROR_BAD_STATE from doca_ctx_start()). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_service(struct doca_urom_worker *worker_ctx, struct doca_urom_service *service_ctx);

/* An existing worker's id to share it, or DOCA_UROM_WORKER_ID_ANY (the default). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_id(struct doca_urom_worker *worker_ctx, uint64_t worker_id);

/* An OR of plugin ids (not 0). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_plugins(struct doca_urom_worker *worker_ctx, uint64_t plugins);

/* A non-empty subset of the service's CPUs. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_cpuset(struct doca_urom_worker *worker_ctx, doca_cpu_set_t cpuset);

DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_gid(struct doca_urom_worker *worker_ctx, uint32_t gid);

/* A power of two (default 64): the number of command tasks, and how many may be in flight.
 *
 * Submission rule: doca_task_submit() of a command task does not fail for want of room. A
 * command the channel to the worker cannot take at once (the worker has not drained earlier
 * ones yet) waits in the library, in room allocated with the tasks, and is sent in submission
 * order as the worker frees room, while doca_pe_progress() runs; it is in flight meanwhile
 * (DOCA_ERROR_AGAIN is never returned). The limit is max_tasks: a task beyond it is refused when
 * allocated (doca_urom_worker_cmd_task_allocate*(): DOCA_ERROR_NO_MEMORY), as DOCA refuses a
 * task beyond its pool. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_max_inflight_tasks(struct doca_urom_worker *worker_ctx, uint32_t max_tasks);

/* `NAME=value` entries for the worker's process; variables that change how programs load
 * (LD_*, MALLOC_*, ...) are refused with DOCA_ERROR_NOT_PERMITTED. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_set_env(struct doca_urom_worker *worker_ctx, char *const env[], size_t count);

/* The id set, or the worker's own once running. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_get_id(struct doca_urom_worker *worker_ctx, uint64_t *worker_id);

DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_get_gid(struct doca_urom_worker *worker_ctx, uint32_t *worker_gid);

DOCA_EXPERIMENTAL
struct doca_ctx *doca_urom_worker_as_ctx(struct doca_urom_worker *worker_ctx);

/* A command task from the worker's pool (running only: DOCA_ERROR_BAD_STATE; all in use:
 * DOCA_ERROR_NO_MEMORY). Its payload buffer's data spans the whole payload space: write the
 * command at its start and set the data to it with doca_buf_set_data(). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_cmd_task_allocate(struct doca_urom_worker *worker_ctx,
						struct doca_urom_worker_cmd_task **task);

DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_cmd_task_allocate_init(struct doca_urom_worker *worker_ctx,
						     uint64_t plugin,
						     struct doca_urom_worker_cmd_task **task);

/* Back to the pool; not while in flight (DOCA_ERROR_NOT_PERMITTED). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_worker_cmd_task_release(struct doca_urom_worker_cmd_task *task);

DOCA_EXPERIMENTAL
void doca_urom_worker_cmd_task_set_plugin(struct doca_urom_worker_cmd_task *task, uint64_t plugin);

/* Required before submitting (DOCA_ERROR_INVALID_VALUE otherwise). */
DOCA_EXPERIMENTAL
void doca_urom_worker_cmd_task_set_cb(struct doca_urom_worker_cmd_task *task,
				      doca_urom_worker_cmd_task_completion_cb_t cb);

DOCA_EXPERIMENTAL
struct doca_buf *doca_urom_worker_cmd_task_get_payload(struct doca_urom_worker_cmd_task *task);

DOCA_EXPERIMENTAL
struct doca_buf *doca_urom_worker_cmd_task_get_response(struct doca_urom_worker_cmd_task *task);

/* 32 bytes of the task's own, zeroed when it is allocated. */
DOCA_EXPERIMENTAL
void *doca_urom_worker_cmd_task_get_user_data(struct doca_urom_worker_cmd_task *task);

DOCA_EXPERIMENTAL
struct doca_task *doca_urom_worker_cmd_task_as_task(struct doca_urom_worker_cmd_task *task);

/* Domains. */

struct doca_urom_domain;

/* The program's non-blocking allgather: gathers `msglen` bytes of `sbuf` from every rank into
 * `rbuf` (rank i's at i * msglen; every rank passes the same msglen) and stores its request in
 * `*req`. DOCA_SUCCESS once started. */
typedef doca_error_t (*doca_urom_domain_allgather_cb_t)(void *sbuf, void *rbuf, size_t msglen, void *coll_info,
							 void **req);

/* DOCA_SUCCESS once the request completed, DOCA_ERROR_IN_PROGRESS before; any other value
 * (negative ones included) fails the domain's start. */
typedef doca_error_t (*doca_urom_domain_req_test_cb_t)(void *req);

/* Releases a request (after it completed, or when a start is abandoned). */
typedef doca_error_t (*doca_urom_domain_req_free_cb_t)(void *req);

/* The out-of-band collective the ranks of a domain exchange their workers and buffers with. */
struct doca_urom_domain_oob_coll {
	doca_urom_domain_allgather_cb_t allgather;
	doca_urom_domain_req_test_cb_t req_test;
	doca_urom_domain_req_free_cb_t req_free;
	/* Passed to allgather. */
	void *coll_info;
	/* How many ranks. */
	uint32_t n_oob_indexes;
	/* This rank, below n_oob_indexes. */
	uint32_t oob_index;
};

DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_create(struct doca_urom_domain **domain_ctx);

/* Idle only (DOCA_ERROR_NOT_PERMITTED otherwise). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_destroy(struct doca_urom_domain *domain_ctx);

/* How many buffers doca_urom_domain_add_buffer() will add; not once buffers were added
 * (DOCA_ERROR_BAD_STATE). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_set_buffers_count(struct doca_urom_domain *domain_ctx, size_t buffers_cnt);

/* A buffer of this host the domain's plugins may reach: its address and length, its packed
 * memory handle and packed remote key (copied; either may be empty). Before a count is set:
 * DOCA_ERROR_BAD_STATE; beyond the count: DOCA_ERROR_FULL. Its segment number is the order it
 * was added in. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_add_buffer(struct doca_urom_domain *domain_ctx,
					 void *buffer,
					 size_t buf_len,
					 void *memh,
					 size_t memh_len,
					 void *mkey,
					 size_t mkey_len);

/* Copies the collective; its three callbacks are required and oob_index < n_oob_indexes. */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_set_oob(struct doca_urom_domain *domain_ctx, struct doca_urom_domain_oob_coll *oob);

/* This host's workers and the domain id of each (workers[i] is domain_worker_ids[i]), unique
 * across the domain. The workers must be running when the domain starts (DOCA_ERROR_BAD_STATE
 * from doca_ctx_start()) and be progressed while it starts (connect them to the domain's
 * progress engine). */
DOCA_EXPERIMENTAL
doca_error_t doca_urom_domain_set_workers(struct doca_urom_domain *domain_ctx,
					  uint64_t *domain_worker_ids,
					  struct doca_urom_worker **workers,
					  size_t workers_cnt);

DOCA_EXPERIMENTAL
struct doca_ctx *doca_urom_domain_as_ctx(struct doca_urom_domain *domain_ctx);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_UROM_H_ */
