/*
 * Misuse of urom's DOCA-named C API: every call with NULL arguments, in the wrong state, or with
 * a bad value returns the documented error and leaves the object usable (services, workers,
 * domains and the rest). Needs a daemon with the graph plugin (UROM_SERVICE_SOCKET); prints
 * "misuse ok" when every check passed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_argp.h>
#include <doca_buf.h>
#include <doca_buf_inventory.h>
#include <doca_ctx.h>
#include <doca_dev.h>
#include <doca_error.h>
#include <doca_log.h>
#include <doca_mmap.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

static uint64_t graph_id;

/* The library's own doca_error_get_name/descr say what the header's weak definitions say. */
static void error_names(void)
{
	const char *(*lib_name)(doca_error_t) = (const char *(*)(doca_error_t))dlsym(RTLD_NEXT, "doca_error_get_name");
	const char *(*lib_descr)(doca_error_t) = (const char *(*)(doca_error_t))dlsym(RTLD_NEXT, "doca_error_get_descr");
	int code;

	CHECK(lib_name != NULL && lib_descr != NULL, "libdoca_common exports the status names");
	for (code = -1; code <= 40; code++) {
		CHECK(strcmp(lib_name((doca_error_t)code), doca_error_get_name((doca_error_t)code)) == 0,
		      "name of %d: %s / %s", code, lib_name((doca_error_t)code),
		      doca_error_get_name((doca_error_t)code));
		CHECK(strcmp(lib_descr((doca_error_t)code), doca_error_get_descr((doca_error_t)code)) == 0,
		      "description of %d", code);
	}
	CHECK(strcmp(lib_name(DOCA_ERROR_BAD_STATE), "DOCA_ERROR_BAD_STATE") == 0, "a name");
	CHECK(strcmp(lib_name((doca_error_t)99), "DOCA_ERROR_UNRECOGNIZED") == 0, "an unknown code");
}

static void null_arguments(void)
{
	struct doca_pe *pe;
	size_t n;
	enum doca_ctx_states state;
	union doca_data data = {0};
	uint32_t u32;
	uint64_t u64;
	void *ptr;
	doca_notification_handle_t handle;

	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_create(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_destroy(NULL));
	CHECK(doca_pe_progress(NULL) == 0, "progress(NULL)");
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_connect_ctx(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_get_num_inflight_tasks(NULL, &n));
	OK(doca_pe_create(&pe));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_connect_ctx(pe, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_get_num_inflight_tasks(pe, NULL));
	/* Notifications (notify.c waits on them). */
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_get_notification_handle(NULL, &handle));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_get_notification_handle(pe, NULL));
	OK(doca_pe_get_notification_handle(pe, &handle));
	CHECK(handle >= 0, "a descriptor: %d", handle);
	OK(doca_pe_request_notification(pe));
	OK(doca_pe_clear_notification(pe, handle));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_request_notification(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_clear_notification(NULL, handle));
	CHECK(doca_pe_progress(pe) == 0, "an empty engine makes no progress");
	OK(doca_pe_destroy(pe));

	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_start(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_stop(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_get_state(NULL, &state));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_set_user_data(NULL, data));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_get_user_data(NULL, &data));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_set_state_changed_cb(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_get_num_inflight_tasks(NULL, &n));

	IS(DOCA_ERROR_INVALID_VALUE, doca_task_submit(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_task_get_status(NULL));
	doca_task_free(NULL);
	doca_task_set_user_data(NULL, data);
	CHECK(doca_task_get_user_data(NULL).u64 == 0, "user data of NULL");
	CHECK(doca_task_get_ctx(NULL) == NULL, "context of NULL");

	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_create(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_destroy(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_max_workers(NULL, 4));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_max_comm_msg_size(NULL, 4096));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_dev(NULL, NULL));
	CHECK(doca_urom_service_as_ctx(NULL) == NULL, "as_ctx(NULL)");
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_plugins_list(NULL, NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_cpuset(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_workers_by_gid_task_allocate(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_workers_by_gid_task_allocate_init(NULL, 0, NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_workers_by_gid_task_release(NULL));
	CHECK(doca_urom_service_get_workers_by_gid_task_as_task(NULL) == NULL, "as_task(NULL)");
	CHECK(doca_urom_service_get_workers_by_gid_task_get_workers_count(NULL) == 0, "count(NULL)");
	CHECK(doca_urom_service_get_workers_by_gid_task_get_worker_ids(NULL) == NULL, "ids(NULL)");
	doca_urom_service_get_workers_by_gid_task_set_gid(NULL, 1);
	doca_urom_service_get_workers_by_gid_task_set_cb(NULL, NULL);

	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_create(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_destroy(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_service(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_id(NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_gid(NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_plugins(NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_max_inflight_tasks(NULL, 4));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_env(NULL, NULL, 0));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_get_id(NULL, &u64));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_get_gid(NULL, &u32));
	CHECK(doca_urom_worker_as_ctx(NULL) == NULL, "as_ctx(NULL)");
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_cmd_task_allocate(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_cmd_task_allocate_init(NULL, 1, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_cmd_task_release(NULL));
	CHECK(doca_urom_worker_cmd_task_get_payload(NULL) == NULL, "payload(NULL)");
	CHECK(doca_urom_worker_cmd_task_get_response(NULL) == NULL, "response(NULL)");
	CHECK(doca_urom_worker_cmd_task_get_user_data(NULL) == NULL, "user data(NULL)");
	CHECK(doca_urom_worker_cmd_task_as_task(NULL) == NULL, "as_task(NULL)");
	doca_urom_worker_cmd_task_set_plugin(NULL, 1);
	doca_urom_worker_cmd_task_set_cb(NULL, NULL);

	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_get_data(NULL, &ptr));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_get_data_len(NULL, &n));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_set_data(NULL, NULL, 0));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_dec_refcount(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_devinfo_create_list(NULL, &u32));
	IS(DOCA_ERROR_INVALID_VALUE, doca_devinfo_destroy_list(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_dev_open(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_dev_close(NULL));
	CHECK(doca_dev_as_devinfo(NULL) == NULL, "as_devinfo(NULL)");
	IS(DOCA_ERROR_INVALID_VALUE, doca_mmap_create(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_inventory_create(4, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_register_source(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_backend_create_with_file(NULL, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_backend_set_sdk_level(NULL, DOCA_LOG_LEVEL_INFO));
	IS(DOCA_ERROR_INVALID_VALUE, doca_argp_register_param(NULL));
}

/* Counts a context's state changes, with the last one. */
struct watch {
	int changes;
	enum doca_ctx_states last;
};

static void watch_state(const union doca_data user_data,
			struct doca_ctx *ctx,
			enum doca_ctx_states prev,
			enum doca_ctx_states next)
{
	struct watch *w = user_data.ptr;

	(void)ctx;
	(void)prev;
	w->changes++;
	w->last = next;
}

static void count_done(struct doca_urom_worker_cmd_task *task,
		       union doca_data task_user_data,
		       union doca_data ctx_user_data)
{
	int *done = task_user_data.ptr;

	(void)task;
	(void)ctx_user_data;
	(*done)++;
}

static void gid_ignored(struct doca_urom_service_get_workers_by_gid_task *task,
			union doca_data task_user_data,
			union doca_data ctx_user_data)
{
	int *done = task_user_data.ptr;

	(void)task;
	(void)ctx_user_data;
	(*done)++;
}

static enum doca_ctx_states state_of(struct doca_ctx *ctx)
{
	enum doca_ctx_states state;

	OK(doca_ctx_get_state(ctx, &state));
	return state;
}

static void progress_until(struct doca_pe *pe, struct doca_ctx *ctx, enum doca_ctx_states want)
{
	while (state_of(ctx) != want)
		doca_pe_progress(pe);
	while (doca_pe_progress(pe))
		;
}

/* A service: setters only while idle, queries only while running, destroy only when idle. */
static struct doca_urom_service *service_states(struct doca_pe *pe)
{
	struct doca_urom_service *service;
	struct doca_urom_service_get_workers_by_gid_task *task;
	struct doca_ctx *ctx;
	const struct doca_urom_service_plugin_info *plugins;
	doca_cpu_set_t cpuset;
	size_t count, i;
	char *socket = getenv("UROM_SERVICE_SOCKET");
	int done = 0;
	union doca_data data = {.ptr = &done};

	OK(doca_urom_service_create(&service));
	ctx = doca_urom_service_as_ctx(service);
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));
	IS(DOCA_ERROR_NOT_CONNECTED, doca_ctx_start(ctx));
	OK(doca_pe_connect_ctx(pe, ctx));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_pe_connect_ctx(pe, ctx));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_max_workers(service, 3));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_max_comm_msg_size(service, 10));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_set_dev(service, NULL));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_service_get_plugins_list(service, &plugins, &count));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_service_get_cpuset(service, &cpuset));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_service_get_workers_by_gid_task_allocate(service, &task));

	/* A daemon that is not there: the start fails and the service stays idle. */
	setenv("UROM_SERVICE_SOCKET", "/nonexistent/urom.sock", 1);
	IS(DOCA_ERROR_NOT_CONNECTED, doca_ctx_start(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE, "a failed start leaves the service idle");
	setenv("UROM_SERVICE_SOCKET", socket, 1);

	OK(doca_urom_service_set_max_workers(service, 2));
	OK(doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_service_set_max_workers(service, 4));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_service_set_max_comm_msg_size(service, 4096));
	IS(DOCA_ERROR_BAD_STATE, doca_pe_connect_ctx(pe, ctx));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_service_destroy(service));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_plugins_list(service, NULL, &count));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_service_get_cpuset(service, NULL));
	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_graph") == 0)
			graph_id = plugins[i].id;
	CHECK(graph_id != 0, "graph plugin");

	/* Workers-by-gid tasks: a callback is needed; not released while in flight. */
	OK(doca_urom_service_get_workers_by_gid_task_allocate(service, &task));
	IS(DOCA_ERROR_INVALID_VALUE, doca_task_submit(doca_urom_service_get_workers_by_gid_task_as_task(task)));
	doca_urom_service_get_workers_by_gid_task_set_gid(task, 77);
	doca_urom_service_get_workers_by_gid_task_set_cb(task, gid_ignored);
	doca_task_set_user_data(doca_urom_service_get_workers_by_gid_task_as_task(task), data);
	OK(doca_task_submit(doca_urom_service_get_workers_by_gid_task_as_task(task)));
	IS(DOCA_ERROR_BAD_STATE, doca_task_submit(doca_urom_service_get_workers_by_gid_task_as_task(task)));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_service_get_workers_by_gid_task_release(task));
	while (!done)
		doca_pe_progress(pe);
	OK(doca_task_get_status(doca_urom_service_get_workers_by_gid_task_as_task(task)));
	CHECK(doca_urom_service_get_workers_by_gid_task_get_workers_count(task) == 0, "group 77 is empty");
	CHECK(doca_task_get_ctx(doca_urom_service_get_workers_by_gid_task_as_task(task)) == ctx, "task's ctx");
	OK(doca_urom_service_get_workers_by_gid_task_release(task));
	return service;
}

struct graph_message {
	uint64_t type;
	uint64_t data;
};

static struct doca_urom_worker *new_worker(struct doca_pe *pe,
					   struct doca_urom_service *service,
					   uint64_t plugins,
					   struct watch *watch)
{
	struct doca_urom_worker *worker;
	struct doca_ctx *ctx;
	union doca_data data = {.ptr = watch};

	OK(doca_urom_worker_create(&worker));
	ctx = doca_urom_worker_as_ctx(worker);
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, watch_state));
	OK(doca_pe_connect_ctx(pe, ctx));
	if (service != NULL)
		OK(doca_urom_worker_set_service(worker, service));
	if (plugins != 0)
		OK(doca_urom_worker_set_plugins(worker, plugins));
	return worker;
}

static void stop_worker(struct doca_pe *pe, struct doca_urom_worker *worker)
{
	struct doca_ctx *ctx = doca_urom_worker_as_ctx(worker);

	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
}

/* A worker: setters only while idle, tasks only while running, destroy only when idle. */
static void worker_states(struct doca_pe *pe, struct doca_urom_service *service)
{
	struct doca_urom_worker *worker, *second, *third, *refused;
	struct doca_urom_worker_cmd_task *tasks[2], *extra;
	struct watch watch = {0}, other = {0};
	struct doca_ctx *ctx;
	struct doca_buf *payload;
	struct graph_message *cmd;
	char *bad_env[] = {"NOEQUALS"};
	char *refused_env[] = {"LD_PRELOAD=/tmp/x.so"};
	char *null_env[] = {NULL};
	doca_cpu_set_t empty;
	void *head;
	size_t len;
	uint16_t ref;
	uint64_t id;
	int done = 0;
	union doca_data data = {.ptr = &done};

	worker = new_worker(pe, NULL, 0, &watch);
	ctx = doca_urom_worker_as_ctx(worker);
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_max_inflight_tasks(worker, 3));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_max_inflight_tasks(worker, 0));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_plugins(worker, 0));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_env(worker, NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_env(worker, bad_env, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_env(worker, null_env, 1));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_worker_set_env(worker, refused_env, 1));
	DOCA_CPU_ZERO(&empty);
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_set_cpuset(worker, empty));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_cmd_task_allocate(worker, &extra));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_worker_get_id(worker, NULL));
	OK(doca_urom_worker_get_id(worker, &id));
	CHECK(id == DOCA_UROM_WORKER_ID_ANY, "a new worker takes any id");
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));
	/* No service set: refused at start. */
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_start(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE, "still idle");

	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_urom_worker_set_plugins(worker, graph_id));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, 2));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_set_id(worker, 5));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_set_gid(worker, 5));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_set_service(worker, service));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_set_max_inflight_tasks(worker, 4));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_worker_destroy(worker));
	progress_until(pe, ctx, DOCA_CTX_STATE_RUNNING);
	CHECK(watch.changes == 2 && watch.last == DOCA_CTX_STATE_RUNNING, "starting, then running");
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_worker_destroy(worker));

	/* Two tasks in the pool. */
	OK(doca_urom_worker_cmd_task_allocate_init(worker, graph_id, &tasks[0]));
	OK(doca_urom_worker_cmd_task_allocate_init(worker, graph_id, &tasks[1]));
	IS(DOCA_ERROR_NO_MEMORY, doca_urom_worker_cmd_task_allocate_init(worker, graph_id, &extra));
	IS(DOCA_ERROR_INVALID_VALUE, doca_task_submit(doca_urom_worker_cmd_task_as_task(tasks[0])));
	payload = doca_urom_worker_cmd_task_get_payload(tasks[0]);
	OK(doca_buf_get_head(payload, &head));
	OK(doca_buf_get_len(payload, &len));
	CHECK(len >= sizeof(*cmd), "payload space");
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_set_data(payload, (char *)head + 1, len));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_set_data_len(payload, len + 1));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_buf_dec_refcount(payload, &ref));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_buf_chain_list(payload, doca_urom_worker_cmd_task_get_response(tasks[0])));
	cmd = head;
	cmd->type = 0;
	cmd->data = 42;
	OK(doca_buf_set_data(payload, head, sizeof(*cmd)));
	doca_urom_worker_cmd_task_set_cb(tasks[0], count_done);
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(tasks[0]), data);
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(tasks[0])));
	IS(DOCA_ERROR_BAD_STATE, doca_task_submit(doca_urom_worker_cmd_task_as_task(tasks[0])));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_worker_cmd_task_release(tasks[0]));
	while (done == 0)
		doca_pe_progress(pe);
	CHECK(done == 1, "one completion");
	OK(doca_task_get_status(doca_urom_worker_cmd_task_as_task(tasks[0])));
	OK(doca_urom_worker_cmd_task_release(tasks[0]));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_cmd_task_release(tasks[0]));
	doca_task_free(doca_urom_worker_cmd_task_as_task(tasks[1]));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_worker_cmd_task_release(tasks[1]));

	/* The service runs two workers at most: a third is refused at start. */
	second = new_worker(pe, service, graph_id, &other);
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(second)));
	third = new_worker(pe, service, graph_id, &other);
	IS(DOCA_ERROR_FULL, doca_ctx_start(doca_urom_worker_as_ctx(third)));
	CHECK(state_of(doca_urom_worker_as_ctx(third)) == DOCA_CTX_STATE_IDLE, "the third stays idle");
	OK(doca_urom_worker_destroy(third));
	progress_until(pe, doca_urom_worker_as_ctx(second), DOCA_CTX_STATE_RUNNING);
	/* Stopped while it runs, then destroyed. */
	stop_worker(pe, second);
	OK(doca_urom_worker_destroy(second));

	/* Stopped, started again, stopped. */
	stop_worker(pe, worker);
	CHECK(watch.changes == 4 && watch.last == DOCA_CTX_STATE_IDLE, "stopping, then idle");
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_RUNNING);
	OK(doca_urom_worker_cmd_task_allocate_init(worker, graph_id, &tasks[0]));
	stop_worker(pe, worker);
	OK(doca_urom_worker_destroy(worker));

	/* A worker with a plugin the daemon does not offer: refused, back to idle from progress. */
	memset(&other, 0, sizeof(other));
	refused = new_worker(pe, service, 1ULL << 61, &other);
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(refused)));
	progress_until(pe, doca_urom_worker_as_ctx(refused), DOCA_CTX_STATE_IDLE);
	CHECK(other.changes == 2 && other.last == DOCA_CTX_STATE_IDLE, "starting, then idle again (%d)",
	      other.changes);
	OK(doca_urom_worker_destroy(refused));
}

/* A collective of one rank whose requests behave as its mode says. */
enum solo_mode { SOLO_OK, SOLO_TEST_FAILS, SOLO_ALLGATHER_FAILS, SOLO_NEVER_DONE };

struct solo {
	enum solo_mode mode;
	int live; /* requests not yet freed */
	int allgathers;
};

static doca_error_t solo_allgather(void *sbuf, void *rbuf, size_t msglen, void *coll_info, void **req)
{
	struct solo *solo = coll_info;

	if (solo->mode == SOLO_ALLGATHER_FAILS)
		return DOCA_ERROR_NOT_CONNECTED;
	memcpy(rbuf, sbuf, msglen);
	solo->live++;
	solo->allgathers++;
	*req = solo;
	return DOCA_SUCCESS;
}

static doca_error_t solo_test(void *req)
{
	struct solo *solo = req;

	switch (solo->mode) {
	case SOLO_TEST_FAILS:
		/* As UCC's collectives fail: a negative status. */
		return (doca_error_t)-1;
	case SOLO_NEVER_DONE:
		return DOCA_ERROR_IN_PROGRESS;
	default:
		return DOCA_SUCCESS;
	}
}

static doca_error_t solo_free(void *req)
{
	struct solo *solo = req;

	solo->live--;
	return DOCA_SUCCESS;
}

/* A domain: setters only while idle, buffers after their count and up to it, workers running at
 * start, destroy only when idle; a failing collective and a stop while starting leave it idle. */
static void domain_states(struct doca_pe *pe, struct doca_urom_service *service)
{
	struct doca_urom_domain *domain;
	struct doca_urom_worker *worker, *idle_worker;
	struct doca_urom_worker *workers[2] = {NULL, NULL};
	struct doca_urom_worker *null_workers[1] = {NULL};
	struct watch watch = {0}, worker_watch = {0}, idle_watch = {0};
	struct doca_ctx *ctx;
	struct solo solo = {.mode = SOLO_OK};
	struct doca_urom_domain_oob_coll coll = {
		.allgather = solo_allgather,
		.req_test = solo_test,
		.req_free = solo_free,
		.coll_info = &solo,
		.n_oob_indexes = 1,
		.oob_index = 0,
	};
	struct doca_urom_domain_oob_coll bad;
	uint64_t ids[2] = {7, 8};
	uint64_t same_ids[2] = {7, 7};
	char key[] = "key";
	union doca_data data = {.ptr = &watch};

	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_create(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_destroy(NULL));
	CHECK(doca_urom_domain_as_ctx(NULL) == NULL, "as_ctx(NULL)");
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_oob(NULL, &coll));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(NULL, ids, workers, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_buffers_count(NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_add_buffer(NULL, key, 4, key, 3, key, 3));

	OK(doca_urom_domain_create(&domain));
	ctx = doca_urom_domain_as_ctx(domain);
	CHECK(ctx != NULL, "a domain is a context");
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, watch_state));

	/* The collective needs its three callbacks and a rank below the number of ranks. */
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_oob(domain, NULL));
	bad = coll;
	bad.req_test = NULL;
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_oob(domain, &bad));
	bad = coll;
	bad.oob_index = 1;
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_oob(domain, &bad));
	bad = coll;
	bad.n_oob_indexes = 0;
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_oob(domain, &bad));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(domain, NULL, workers, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(domain, ids, NULL, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(domain, ids, null_workers, 1));

	/* Buffers: a count first, then no more than the count, and the count stays. */
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_add_buffer(domain, key, 4, key, 3, key, 3));
	OK(doca_urom_domain_set_buffers_count(domain, 1));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_add_buffer(domain, key, 4, NULL, 3, key, 3));
	OK(doca_urom_domain_add_buffer(domain, key, 4, key, 3, key, 3));
	IS(DOCA_ERROR_FULL, doca_urom_domain_add_buffer(domain, key, 4, key, 3, key, 3));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_buffers_count(domain, 2));

	/* Started: not without an engine, a collective and workers. */
	IS(DOCA_ERROR_NOT_CONNECTED, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));
	OK(doca_pe_connect_ctx(pe, ctx));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_start(ctx));
	OK(doca_urom_domain_set_oob(domain, &coll));
	IS(DOCA_ERROR_INVALID_VALUE, doca_ctx_start(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE && watch.changes == 0, "refused starts leave it idle");

	/* Workers: each once, each id once, each running when the domain starts. */
	worker = new_worker(pe, service, graph_id, &worker_watch);
	idle_worker = new_worker(pe, service, graph_id, &idle_watch);
	workers[0] = worker;
	workers[1] = worker;
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(domain, ids, workers, 2));
	workers[1] = idle_worker;
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_workers(domain, same_ids, workers, 2));
	OK(doca_urom_domain_set_workers(domain, ids, workers, 1));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(worker)));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	progress_until(pe, doca_urom_worker_as_ctx(worker), DOCA_CTX_STATE_RUNNING);
	OK(doca_urom_domain_set_workers(domain, ids, workers, 2));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE && watch.changes == 0, "a worker that is not running");
	OK(doca_urom_domain_set_workers(domain, ids, workers, 1));

	/* A domain of one rank: started, then no settings and no destroy until it is stopped. */
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(ctx));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_oob(domain, &coll));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_workers(domain, ids, workers, 1));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_buffers_count(domain, 1));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_add_buffer(domain, key, 4, key, 3, key, 3));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_domain_destroy(domain));
	progress_until(pe, ctx, DOCA_CTX_STATE_RUNNING);
	CHECK(watch.changes == 2 && watch.last == DOCA_CTX_STATE_RUNNING, "starting, then running");
	CHECK(solo.allgathers == 3 && solo.live == 0, "%d allgathers, %d requests not freed", solo.allgathers,
	      solo.live);
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_oob(domain, &coll));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_add_buffer(domain, key, 4, key, 3, key, 3));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_domain_destroy(domain));
	OK(doca_ctx_stop(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE, "stopped at once");
	IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));

	/* The program's collective fails (a negative req_test, a failed allgather): back to idle,
	 * every request freed, the settings kept. */
	solo.mode = SOLO_TEST_FAILS;
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
	CHECK(solo.live == 0, "%d requests not freed", solo.live);
	solo.mode = SOLO_ALLGATHER_FAILS;
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
	CHECK(solo.live == 0, "%d requests not freed", solo.live);

	/* Stopped while starting: the start is abandoned and its request freed. */
	solo.mode = SOLO_NEVER_DONE;
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	while (solo.live == 0)
		doca_pe_progress(pe);
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_domain_destroy(domain));
	OK(doca_ctx_stop(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE && solo.live == 0, "abandoned, %d requests not freed",
	      solo.live);

	/* The settings outlived it all: it starts again. */
	solo.mode = SOLO_OK;
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_RUNNING);
	OK(doca_ctx_stop(ctx));
	OK(doca_urom_domain_destroy(domain));
	IS(DOCA_ERROR_INVALID_VALUE, doca_urom_domain_set_buffers_count(domain, 1));
	stop_worker(pe, worker);
	OK(doca_urom_worker_destroy(worker));
	OK(doca_urom_worker_destroy(idle_worker));
}

/* A worker on a stopped service is refused at start. */
static void stopped_service(struct doca_pe *pe, struct doca_urom_service *service)
{
	struct watch watch = {0};
	struct doca_urom_worker *worker = new_worker(pe, service, graph_id, &watch);

	IS(DOCA_ERROR_BAD_STATE, doca_ctx_start(doca_urom_worker_as_ctx(worker)));
	OK(doca_urom_worker_destroy(worker));
}

/* Memory maps, inventories and buffer lists. */
static void buffers(void)
{
	static char memory[256];
	struct doca_mmap *mmap;
	struct doca_buf_inventory *inventory;
	struct doca_buf *a, *b, *next, *last, *extra;
	uint32_t n;
	uint16_t ref;
	void *data;
	size_t len;

	OK(doca_mmap_create(&mmap));
	OK(doca_buf_inventory_create(2, &inventory));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_inventory_create(0, &inventory));
	IS(DOCA_ERROR_BAD_STATE, doca_buf_inventory_buf_get_by_addr(inventory, mmap, memory, 64, &a));
	OK(doca_buf_inventory_start(inventory));
	IS(DOCA_ERROR_BAD_STATE, doca_mmap_start(mmap));
	IS(DOCA_ERROR_INVALID_VALUE, doca_mmap_set_memrange(mmap, NULL, 64));
	OK(doca_mmap_set_memrange(mmap, memory, sizeof(memory)));
	OK(doca_mmap_start(mmap));
	IS(DOCA_ERROR_BAD_STATE, doca_mmap_set_memrange(mmap, memory, 64));
	IS(DOCA_ERROR_INVALID_VALUE, doca_buf_inventory_buf_get_by_addr(inventory, mmap, memory + 200, 64, &a));
	OK(doca_buf_inventory_buf_get_by_data(inventory, mmap, memory, 64, &a));
	OK(doca_buf_get_data(a, &data));
	OK(doca_buf_get_data_len(a, &len));
	CHECK(data == memory && len == 64, "data of a buffer got by data");
	OK(doca_buf_inventory_buf_get_by_addr(inventory, mmap, memory + 64, 64, &b));
	OK(doca_buf_get_data_len(b, &len));
	CHECK(len == 0, "a buffer got by address has no data");
	IS(DOCA_ERROR_NO_MEMORY, doca_buf_inventory_buf_get_by_addr(inventory, mmap, memory, 8, &extra));
	OK(doca_buf_inventory_get_num_free_elements(inventory, &n));
	CHECK(n == 0, "%u free", n);
	OK(doca_buf_chain_list(a, b));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_buf_chain_list(a, b));
	OK(doca_buf_get_list_len(a, &n));
	CHECK(n == 2, "a list of %u", n);
	OK(doca_buf_get_next_in_list(a, &next));
	OK(doca_buf_get_last_in_list(a, &last));
	CHECK(next == b && last == b, "the list is a, b");
	OK(doca_buf_get_next_in_list(b, &next));
	CHECK(next == NULL, "b ends it");
	IS(DOCA_ERROR_NOT_PERMITTED, doca_buf_dec_refcount(b, &ref));
	IS(DOCA_ERROR_IN_USE, doca_buf_inventory_destroy(inventory));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_mmap_destroy(mmap));
	OK(doca_buf_inc_refcount(a, &ref));
	CHECK(ref == 2, "two references");
	OK(doca_buf_dec_refcount(a, &ref));
	OK(doca_buf_dec_refcount(a, &ref));
	CHECK(ref == 0, "no reference left");
	OK(doca_buf_inventory_get_num_free_elements(inventory, &n));
	CHECK(n == 2, "the whole list went back (%u free)", n);
	OK(doca_buf_inventory_destroy(inventory));
	OK(doca_mmap_stop(mmap));
	OK(doca_mmap_destroy(mmap));
}

/* Devices from the service file. */
static void devices(void)
{
	struct doca_devinfo **list;
	struct doca_devinfo_rep **reps;
	struct doca_dev *dev;
	char small[8];
	char name[DOCA_DEVINFO_IBDEV_NAME_SIZE];
	char iface[DOCA_DEVINFO_IFACE_NAME_SIZE];
	char pci[DOCA_DEVINFO_PCI_ADDR_SIZE];
	uint32_t n, nreps;
	uint8_t equal;
	enum doca_pci_func_type type;

	OK(doca_devinfo_create_list(&list, &n));
	CHECK(n == 2, "%u devices: one per network device of this host's line", n);
	IS(DOCA_ERROR_INVALID_VALUE, doca_devinfo_get_ibdev_name(list[0], small, sizeof(small)));
	OK(doca_devinfo_get_ibdev_name(list[1], name, sizeof(name)));
	CHECK(strcmp(name, "mlx5_1") == 0, "second device %s", name);
	OK(doca_devinfo_get_pci_addr_str(list[1], pci));
	CHECK(strcmp(pci, "0000:03:00.0") == 0, "pci %s", pci);
	OK(doca_devinfo_is_equal_pci_addr(list[1], "03:00.0", &equal));
	CHECK(equal == 1, "the short address names it");
	OK(doca_devinfo_is_equal_pci_addr(list[1], "0000:04:00.0", &equal));
	CHECK(equal == 0, "another address does not");
	IS(DOCA_ERROR_NOT_SUPPORTED, doca_devinfo_get_iface_name(list[0], iface, sizeof(iface)));
	OK(doca_devinfo_get_pci_func_type(list[0], &type));
	CHECK(type == DOCA_PCI_FUNC_TYPE_PF, "a physical function");
	OK(doca_dev_open(list[0], &dev));
	OK(doca_devinfo_destroy_list(list));
	IS(DOCA_ERROR_INVALID_VALUE, doca_devinfo_destroy_list(list));
	OK(doca_devinfo_get_ibdev_name(doca_dev_as_devinfo(dev), name, sizeof(name)));
	CHECK(strcmp(name, "mlx5_0") == 0, "an open device outlives its list: %s", name);
	IS(DOCA_ERROR_NOT_SUPPORTED, doca_devinfo_rep_create_list(dev, DOCA_DEVINFO_REP_FILTER_ALL, &reps, &nreps));
	OK(doca_dev_close(dev));
}

static doca_error_t take_string(void *param, void *config)
{
	snprintf(config, 64, "%s", (const char *)param);
	return DOCA_SUCCESS;
}

/* Argument parsing. */
static void arguments(void)
{
	struct doca_argp_param *param;
	char config[64] = "";
	char *argv_unknown[] = {"misuse", "--bogus"};
	char *argv_good[] = {"misuse", "-n", "given"};

	IS(DOCA_ERROR_BAD_STATE, doca_argp_param_create(&param));
	IS(DOCA_ERROR_BAD_STATE, doca_argp_destroy());
	OK(doca_argp_init("misuse", config));
	IS(DOCA_ERROR_BAD_STATE, doca_argp_init("misuse", config));
	OK(doca_argp_param_create(&param));
	doca_argp_param_set_short_name(param, "n");
	IS(DOCA_ERROR_INITIALIZATION, doca_argp_register_param(param));
	OK(doca_argp_param_create(&param));
	doca_argp_param_set_short_name(param, "n");
	doca_argp_param_set_long_name(param, "name");
	doca_argp_param_set_description(param, "A name.");
	doca_argp_param_set_callback(param, take_string);
	doca_argp_param_set_type(param, DOCA_ARGP_TYPE_DEVICE);
	IS(DOCA_ERROR_NOT_SUPPORTED, doca_argp_register_param(param));
	OK(doca_argp_param_create(&param));
	doca_argp_param_set_short_name(param, "n");
	doca_argp_param_set_long_name(param, "name");
	doca_argp_param_set_description(param, "A name.");
	doca_argp_param_set_callback(param, take_string);
	doca_argp_param_set_type(param, DOCA_ARGP_TYPE_STRING);
	OK(doca_argp_register_param(param));
	IS(DOCA_ERROR_NOT_SUPPORTED, doca_argp_start(2, argv_unknown));
	OK(doca_argp_start(3, argv_good));
	CHECK(strcmp(config, "given") == 0, "the callback got `%s`", config);
	OK(doca_argp_destroy());
}

/* Logging: sources, levels, an SDK backend that receives urom's errors. */
static void logging(FILE *sdk_file)
{
	struct doca_log_backend *backend;
	int source;

	IS(DOCA_ERROR_INVALID_VALUE, doca_log_level_set_global_lower_limit(45));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_level_set_global_lower_limit(80));
	OK(doca_log_register_source("UROM::TEST::MISUSE", &source));
	OK(doca_log_backend_create_with_file_sdk(sdk_file, &backend));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_backend_set_sdk_level(backend, 33));
	OK(doca_log_backend_set_sdk_level(backend, DOCA_LOG_LEVEL_ERROR));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log_backend_set_level_lower_limit(backend, DOCA_LOG_LEVEL_INFO));
}

/* An application backend gets the program's messages at its levels. */
static void app_logging(void)
{
	struct doca_log_backend *backend;
	FILE *file = tmpfile();
	char line[512];
	int source, seen = 0, verbose = 0;

	CHECK(file != NULL, "tmpfile");
	OK(doca_log_register_source("UROM::TEST::APP", &source));
	OK(doca_log_backend_create_with_file(file, &backend));
	OK(doca_log_backend_set_level_lower_limit(backend, DOCA_LOG_LEVEL_WARNING));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log(DOCA_LOG_LEVEL_ERROR, 12345, __FILE__, __LINE__, __func__, "x"));
	IS(DOCA_ERROR_INVALID_VALUE, doca_log(33, source, __FILE__, __LINE__, __func__, "x"));
	OK(doca_log(DOCA_LOG_LEVEL_ERROR, source, __FILE__, __LINE__, __func__, "answer %d", 42));
	OK(doca_log(DOCA_LOG_LEVEL_INFO, source, __FILE__, __LINE__, __func__, "too verbose"));
	rewind(file);
	while (fgets(line, sizeof(line), file) != NULL) {
		if (strstr(line, "[DOCA][ERR][misuse.c:") != NULL && strstr(line, "][app_logging] answer 42") != NULL)
			seen = 1;
		if (strstr(line, "too verbose") != NULL)
			verbose = 1;
	}
	CHECK(seen && !verbose, "the backend shows errors, not information");
	fclose(file);
}

int main(void)
{
	struct doca_pe *pe;
	struct doca_urom_service *service;
	FILE *sdk_file = tmpfile();
	char line[512];
	int refused_logged = 0;
	int domain_failure_logged = 0;

	CHECK(sdk_file != NULL, "tmpfile");
	error_names();
	null_arguments();
	buffers();
	devices();
	arguments();
	logging(sdk_file);
	app_logging();

	OK(doca_pe_create(&pe));
	service = service_states(pe);
	worker_states(pe, service);
	domain_states(pe, service);
	OK(doca_ctx_stop(doca_urom_service_as_ctx(service)));
	stopped_service(pe, service);
	while (doca_pe_progress(pe))
		;
	IS(DOCA_ERROR_IN_USE, doca_pe_destroy(pe));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));

	/* urom said why things failed, through the SDK backend. */
	rewind(sdk_file);
	while (fgets(line, sizeof(line), sdk_file) != NULL)
		if (strstr(line, "[urom::worker] the worker did not start") != NULL)
			refused_logged = 1;
		else if (strstr(line, "[urom::domain] the domain did not start: the out-of-band exchange failed: "
				      "the out-of-band req_test returned") != NULL)
			domain_failure_logged = 1;
	CHECK(refused_logged, "the refused worker was logged");
	CHECK(domain_failure_logged, "the failed domain start was logged");
	printf("misuse ok\n");
	return 0;
}
