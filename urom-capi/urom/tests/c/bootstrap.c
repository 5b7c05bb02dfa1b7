/*
 * The multi-worker bootstrap through urom's DOCA-named C API, as a DOCA UROM host writes it:
 * a service on the device of this host's service-file line, the graph plugin found in its
 * plugin list, NB_WORKERS threads each with its own progress engine and worker (id = index,
 * group = index % 2), loopbacks pipelined through tasks resubmitted from their callback, the
 * faulty plugin's answers (an error status, the worker's environment), a command stopped in
 * flight, the workers of each group queried with tasks, and everything stopped and destroyed. Exits 0 and prints "bootstrap ok" when every check passed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_buf.h>
#include <doca_ctx.h>
#include <doca_dev.h>
#include <doca_error.h>
#include <doca_log.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

DOCA_LOG_REGISTER(UROM::TEST::BOOTSTRAP);

#define NB_WORKERS 4
#define LOOPBACKS 200
#define IN_FLIGHT 2

struct graph_message {
	uint64_t type;
	uint64_t data;
};

static uint64_t graph_id;
static uint64_t faulty_id;

/* State changes seen by a context, in order. */
struct transitions {
	int count;
	enum doca_ctx_states seen[16];
};

static void state_changed(const union doca_data user_data,
			  struct doca_ctx *ctx,
			  enum doca_ctx_states prev,
			  enum doca_ctx_states next)
{
	struct transitions *t = user_data.ptr;
	enum doca_ctx_states now;

	OK(doca_ctx_get_state(ctx, &now));
	CHECK(now == next, "the callback runs once the context is in its new state");
	CHECK(t->count == 0 || t->seen[t->count - 1] == prev, "transitions chain");
	if (t->count < 16)
		t->seen[t->count++] = next;
}

/* What a worker thread does and sees; its first member is what its state callback records. */
struct worker_run {
	struct transitions transitions;
	int index;
	struct doca_urom_service *service;
	uint64_t done;     /* loopbacks completed */
	uint64_t next;     /* next value to send */
	uint64_t sum_sent; /* of every value sent */
	uint64_t sum_back; /* of every value received */
	int shutdown_seen; /* commands completed by the stop */
	pthread_t thread;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int running_workers;
static int stop_workers;

static void fill(struct doca_urom_worker_cmd_task *task, uint64_t value)
{
	struct doca_buf *payload = doca_urom_worker_cmd_task_get_payload(task);
	struct graph_message *cmd;
	size_t room;

	OK(doca_buf_get_data(payload, (void **)&cmd));
	OK(doca_buf_get_data_len(payload, &room));
	CHECK(room >= sizeof(*cmd), "payload space %zu", room);
	cmd->type = 0;
	cmd->data = value;
	OK(doca_buf_set_data(payload, cmd, sizeof(*cmd)));
}

static void loopback_done(struct doca_urom_worker_cmd_task *task,
			  union doca_data task_user_data,
			  union doca_data ctx_user_data)
{
	struct worker_run *run = task_user_data.ptr;
	struct doca_buf *response = doca_urom_worker_cmd_task_get_response(task);
	struct graph_message *notif;
	size_t len;
	uint64_t *mine = doca_urom_worker_cmd_task_get_user_data(task);

	CHECK(ctx_user_data.ptr == run, "the worker context's user data");
	OK(doca_task_get_status(doca_urom_worker_cmd_task_as_task(task)));
	OK(doca_buf_get_data_len(response, &len));
	CHECK(len == sizeof(*notif), "notification of %zu bytes", len);
	OK(doca_buf_get_data(response, (void **)&notif));
	CHECK(notif->data == mine[0], "loopback returned %lu for %lu", (unsigned long)notif->data,
	      (unsigned long)mine[0]);
	run->sum_back += notif->data;
	run->done++;
	if (run->next < LOOPBACKS) {
		/* Submitted again from its own callback. */
		mine[0] = 1000 * (uint64_t)run->index + run->next++;
		run->sum_sent += mine[0];
		fill(task, mine[0]);
		OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
	} else {
		OK(doca_urom_worker_cmd_task_release(task));
	}
}

/* Completes a command in flight when its worker stopped: answered before the stop took it, or
 * flushed by the stop. */
static void shutdown_done(struct doca_urom_worker_cmd_task *task,
			  union doca_data task_user_data,
			  union doca_data ctx_user_data)
{
	struct worker_run *run = task_user_data.ptr;
	doca_error_t status = doca_task_get_status(doca_urom_worker_cmd_task_as_task(task));

	(void)ctx_user_data;
	CHECK(status == DOCA_SUCCESS || status == DOCA_ERROR_SHUTDOWN, "stopped with %s",
	      doca_error_get_name(status));
	run->shutdown_seen++;
	OK(doca_urom_worker_cmd_task_release(task));
}

static struct doca_urom_worker_cmd_task *new_task(struct doca_urom_worker *worker,
						  struct worker_run *run,
						  doca_urom_worker_cmd_task_completion_cb_t cb,
						  uint64_t value)
{
	struct doca_urom_worker_cmd_task *task;
	union doca_data data = {.ptr = run};
	uint64_t *mine;

	OK(doca_urom_worker_cmd_task_allocate_init(worker, graph_id, &task));
	mine = doca_urom_worker_cmd_task_get_user_data(task);
	CHECK(mine != NULL && mine[0] == 0 && mine[3] == 0, "fresh user data is zero");
	mine[0] = value;
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
	doca_urom_worker_cmd_task_set_cb(task, cb);
	fill(task, value);
	return task;
}

/* What the faulty plugin answered: its status and bytes. */
struct faulty_answer {
	int done;
	doca_error_t status;
	char bytes[64];
};

static void faulty_done(struct doca_urom_worker_cmd_task *task,
			union doca_data task_user_data,
			union doca_data ctx_user_data)
{
	struct faulty_answer *answer = task_user_data.ptr;
	size_t len;

	(void)ctx_user_data;
	answer->status = doca_task_get_status(doca_urom_worker_cmd_task_as_task(task));
	/* One byte left for the NUL. */
	len = copy_response(task, answer->bytes, sizeof(answer->bytes) - 1);
	answer->bytes[len] = 0;
	answer->done = 1;
	OK(doca_urom_worker_cmd_task_release(task));
}

/* Sends `text` to the faulty plugin and waits for its answer. */
static void ask_faulty(struct doca_pe *pe,
		       struct doca_urom_worker *worker,
		       const char *text,
		       struct faulty_answer *answer)
{
	struct doca_urom_worker_cmd_task *task;
	struct doca_buf *payload;
	union doca_data data = {.ptr = answer};
	void *room;

	memset(answer, 0, sizeof(*answer));
	OK(doca_urom_worker_cmd_task_allocate(worker, &task));
	doca_urom_worker_cmd_task_set_plugin(task, faulty_id);
	doca_urom_worker_cmd_task_set_cb(task, faulty_done);
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
	payload = doca_urom_worker_cmd_task_get_payload(task);
	OK(doca_buf_get_data(payload, &room));
	memcpy(room, text, strlen(text));
	OK(doca_buf_set_data(payload, room, strlen(text)));
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
	while (!answer->done)
		doca_pe_progress(pe);
}

static int should_stop(void)
{
	int stop;

	pthread_mutex_lock(&lock);
	stop = stop_workers;
	pthread_mutex_unlock(&lock);
	return stop;
}

static void *worker_main(void *arg)
{
	struct worker_run *run = arg;
	struct doca_pe *pe;
	struct doca_urom_worker *worker;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	union doca_data data = {.ptr = run};
	char *env[] = {"UROM_BOOTSTRAP_TEST=1"};
	uint64_t id;
	uint32_t gid;
	size_t inflight;
	int i, progressed = 0;

	OK(doca_pe_create(&pe));
	OK(doca_urom_worker_create(&worker));
	ctx = doca_urom_worker_as_ctx(worker);
	CHECK(ctx != NULL, "as_ctx");
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, state_changed));
	OK(doca_urom_worker_set_service(worker, run->service));
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_worker_set_id(worker, (uint64_t)run->index));
	OK(doca_urom_worker_set_gid(worker, (uint32_t)(run->index % 2)));
	OK(doca_urom_worker_set_env(worker, env, 1));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, 4));
	OK(doca_urom_worker_set_plugins(worker, graph_id | faulty_id));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	OK(doca_ctx_get_state(ctx, &state));
	CHECK(state == DOCA_CTX_STATE_STARTING, "starting after start");
	do {
		progressed += doca_pe_progress(pe);
		OK(doca_ctx_get_state(ctx, &state));
	} while (state == DOCA_CTX_STATE_STARTING);
	CHECK(state == DOCA_CTX_STATE_RUNNING && progressed > 0, "running, state %d", state);
	OK(doca_urom_worker_get_id(worker, &id));
	OK(doca_urom_worker_get_gid(worker, &gid));
	CHECK(id == (uint64_t)run->index && gid == (uint32_t)(run->index % 2), "id %lu gid %u",
	      (unsigned long)id, gid);

	/* Loopbacks, IN_FLIGHT at a time, each task resubmitted from its callback. */
	for (i = 0; i < IN_FLIGHT; i++) {
		uint64_t value = 1000 * (uint64_t)run->index + run->next++;

		run->sum_sent += value;
		OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(new_task(worker, run, loopback_done, value))));
	}
	OK(doca_pe_get_num_inflight_tasks(pe, &inflight));
	CHECK(inflight == IN_FLIGHT, "%zu in flight", inflight);
	while (run->done < LOOPBACKS)
		doca_pe_progress(pe);
	CHECK(run->sum_back == run->sum_sent, "every value came back");
	OK(doca_ctx_get_num_inflight_tasks(ctx, &inflight));
	CHECK(inflight == 0, "nothing left in flight");

	if (run->index == 0) {
		struct faulty_answer answer;

		ask_faulty(pe, worker, "env:UROM_BOOTSTRAP_TEST", &answer);
		OK(answer.status);
		CHECK(strcmp(answer.bytes, "1") == 0, "the worker's environment says `%s`", answer.bytes);
		ask_faulty(pe, worker, "fail", &answer);
		IS(DOCA_ERROR_NOT_SUPPORTED, answer.status);
	}

	pthread_mutex_lock(&lock);
	running_workers++;
	pthread_mutex_unlock(&lock);
	while (!should_stop())
		doca_pe_progress(pe);

	/* A command in flight when the worker stops. */
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(new_task(worker, run, shutdown_done, 7))));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
	progressed = 0;
	do {
		progressed += doca_pe_progress(pe);
		OK(doca_ctx_get_state(ctx, &state));
	} while (state != DOCA_CTX_STATE_IDLE);
	CHECK(progressed > 0 && run->shutdown_seen == 1, "the stop completed the command");
	while (doca_pe_progress(pe))
		;
	CHECK(run->transitions.count == 4 && run->transitions.seen[0] == DOCA_CTX_STATE_STARTING &&
		      run->transitions.seen[1] == DOCA_CTX_STATE_RUNNING &&
		      run->transitions.seen[2] == DOCA_CTX_STATE_STOPPING &&
		      run->transitions.seen[3] == DOCA_CTX_STATE_IDLE,
	      "worker %d saw %d transitions", run->index, run->transitions.count);
	IS(DOCA_ERROR_IN_USE, doca_pe_destroy(pe));
	OK(doca_urom_worker_destroy(worker));
	OK(doca_pe_destroy(pe));
	return NULL;
}

struct gid_query {
	int done;
	doca_error_t status;
	size_t count;
	uint64_t ids[NB_WORKERS];
};

static void gid_done(struct doca_urom_service_get_workers_by_gid_task *task,
		     union doca_data task_user_data,
		     union doca_data ctx_user_data)
{
	struct gid_query *query = task_user_data.ptr;
	const uint64_t *ids = doca_urom_service_get_workers_by_gid_task_get_worker_ids(task);
	size_t i;

	(void)ctx_user_data;
	query->status = doca_task_get_status(doca_urom_service_get_workers_by_gid_task_as_task(task));
	query->count = doca_urom_service_get_workers_by_gid_task_get_workers_count(task);
	for (i = 0; i < query->count && i < NB_WORKERS; i++)
		query->ids[i] = ids[i];
	query->done = 1;
	OK(doca_urom_service_get_workers_by_gid_task_release(task));
}

static void query_group(struct doca_pe *pe, struct doca_urom_service *service, uint32_t gid)
{
	struct doca_urom_service_get_workers_by_gid_task *task;
	struct gid_query query = {0};
	union doca_data data = {.ptr = &query};
	size_t i;

	OK(doca_urom_service_get_workers_by_gid_task_allocate_init(service, gid, gid_done, &task));
	doca_task_set_user_data(doca_urom_service_get_workers_by_gid_task_as_task(task), data);
	OK(doca_task_submit(doca_urom_service_get_workers_by_gid_task_as_task(task)));
	while (!query.done)
		doca_pe_progress(pe);
	OK(query.status);
	CHECK(query.count == NB_WORKERS / 2, "group %u has %zu workers", gid, query.count);
	for (i = 0; i < query.count; i++)
		CHECK(query.ids[i] % 2 == gid, "worker %lu in group %u", (unsigned long)query.ids[i], gid);
	DOCA_LOG_INFO("group %u: %zu workers", gid, query.count);
}

/* The device of this host's service-file line whose InfiniBand name is `name`. */
static struct doca_dev *open_device(const char *name)
{
	struct doca_devinfo **list;
	struct doca_dev *dev = NULL;
	char ibdev[DOCA_DEVINFO_IBDEV_NAME_SIZE];
	char pci[DOCA_DEVINFO_PCI_ADDR_SIZE];
	uint32_t n, i;

	OK(doca_devinfo_create_list(&list, &n));
	CHECK(n >= 1, "%u devices", n);
	for (i = 0; i < n; i++) {
		OK(doca_devinfo_get_ibdev_name(list[i], ibdev, sizeof(ibdev)));
		if (strcmp(ibdev, name) == 0) {
			OK(doca_dev_open(list[i], &dev));
			break;
		}
	}
	OK(doca_devinfo_destroy_list(list));
	CHECK(dev != NULL, "no device %s", name);
	OK(doca_devinfo_get_pci_addr_str(doca_dev_as_devinfo(dev), pci));
	DOCA_LOG_INFO("device %s at %s", name, pci);
	return dev;
}

int main(void)
{
	struct doca_log_backend *sdk_log;
	struct doca_pe *pe;
	struct doca_dev *dev;
	struct doca_urom_service *service;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	const struct doca_urom_service_plugin_info *plugins;
	struct transitions service_transitions = {0};
	union doca_data data = {.ptr = &service_transitions};
	struct worker_run runs[NB_WORKERS];
	doca_cpu_set_t cpuset;
	size_t count, i;
	int cpus = 0, ready;

	OK(doca_log_backend_create_standard());
	OK(doca_log_backend_create_with_file_sdk(stderr, &sdk_log));
	OK(doca_log_backend_set_sdk_level(sdk_log, DOCA_LOG_LEVEL_WARNING));

	dev = open_device("mlx5_0");
	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	ctx = doca_urom_service_as_ctx(service);
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, state_changed));
	IS(DOCA_ERROR_NOT_CONNECTED, doca_ctx_start(ctx));
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_service_set_max_workers(service, NB_WORKERS));
	OK(doca_urom_service_set_dev(service, dev));
	OK(doca_ctx_start(ctx));
	OK(doca_ctx_get_state(ctx, &state));
	CHECK(state == DOCA_CTX_STATE_RUNNING, "a service runs once started");
	CHECK(service_transitions.count == 0, "state callbacks wait for progress");
	CHECK(doca_pe_progress(pe) == 1, "a state change is progress");
	CHECK(service_transitions.count == 1 && service_transitions.seen[0] == DOCA_CTX_STATE_RUNNING,
	      "the service's callback ran");

	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_graph") == 0)
			break;
	CHECK(i < count, "the service offers worker_graph");
	CHECK(plugins[i].version == 1, "graph version %lu", (unsigned long)plugins[i].version);
	graph_id = plugins[i].id;
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_faulty") == 0)
			faulty_id = plugins[i].id;
	CHECK(faulty_id != 0, "the service offers worker_faulty");
	OK(doca_urom_service_get_cpuset(service, &cpuset));
	for (i = 0; i < 1024; i++)
		cpus += doca_cpu_is_set((int)i, &cpuset);
	CHECK(cpus >= 1, "the service has CPUs");

	for (i = 0; i < NB_WORKERS; i++) {
		memset(&runs[i], 0, sizeof(runs[i]));
		runs[i].index = (int)i;
		runs[i].service = service;
		CHECK(pthread_create(&runs[i].thread, NULL, worker_main, &runs[i]) == 0, "thread");
	}
	do {
		doca_pe_progress(pe);
		pthread_mutex_lock(&lock);
		ready = running_workers;
		pthread_mutex_unlock(&lock);
	} while (ready != NB_WORKERS);

	query_group(pe, service, 0);
	query_group(pe, service, 1);

	pthread_mutex_lock(&lock);
	stop_workers = 1;
	pthread_mutex_unlock(&lock);
	for (i = 0; i < NB_WORKERS; i++)
		pthread_join(runs[i].thread, NULL);

	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_service_destroy(service));
	OK(doca_ctx_stop(ctx));
	OK(doca_ctx_get_state(ctx, &state));
	CHECK(state == DOCA_CTX_STATE_IDLE, "a service stops at once");
	while (doca_pe_progress(pe))
		;
	CHECK(service_transitions.count == 2 && service_transitions.seen[1] == DOCA_CTX_STATE_IDLE,
	      "the service went back to idle");
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
	OK(doca_dev_close(dev));
	printf("bootstrap ok: %d workers, %d loopbacks each\n", NB_WORKERS, LOOPBACKS);
	return 0;
}
