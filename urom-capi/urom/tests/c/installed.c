/*
 * A DOCA UROM host built against an installed urom with nothing but pkg-config (and the same
 * file built by meson with dependency('doca-urom')): the versions of doca_version.h, argument
 * parsing through -ldoca_argp, a service (UROM_SERVICE_SOCKET), and a worker running the graph
 * plugin and the plugin named on the command line (a C plugin built against the installed
 * plugin headers), LOOPBACKS loopbacks through each. Exits 0 and prints "installed ok" when
 * every check passed.
 *
 *   installed [--plugin NAME]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_argp.h>
#include <doca_buf.h>
#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>
#include <doca_version.h>

#include "check.h"

#define LOOPBACKS 100

struct config {
	char plugin[64];
};

struct loopback {
	uint64_t type;
	uint64_t data;
};

static doca_error_t plugin_flag(void *value, void *config)
{
	struct config *cfg = config;

	snprintf(cfg->plugin, sizeof(cfg->plugin), "%s", (const char *)value);
	return DOCA_SUCCESS;
}

static void register_flags(void)
{
	struct doca_argp_param *param;

	OK(doca_argp_param_create(&param));
	doca_argp_param_set_long_name(param, "plugin");
	doca_argp_param_set_arguments(param, "<name>");
	doca_argp_param_set_description(param, "a second loopback plugin");
	doca_argp_param_set_callback(param, plugin_flag);
	doca_argp_param_set_type(param, DOCA_ARGP_TYPE_STRING);
	OK(doca_argp_register_param(param));
}

static void loopback_done(struct doca_urom_worker_cmd_task *task,
			  union doca_data task_user_data,
			  union doca_data ctx_user_data)
{
	uint64_t *done = task_user_data.ptr;
	uint64_t *sent = doca_urom_worker_cmd_task_get_user_data(task);
	struct loopback back;

	(void)ctx_user_data;
	OK(doca_task_get_status(doca_urom_worker_cmd_task_as_task(task)));
	CHECK(copy_response(task, &back, sizeof(back)) == sizeof(back), "a whole answer");
	CHECK(back.data == sent[0], "%lu came back for %lu", (unsigned long)back.data,
	      (unsigned long)sent[0]);
	(*done)++;
	OK(doca_urom_worker_cmd_task_release(task));
}

/* LOOPBACKS loopbacks through `plugin`, one at a time. */
static void loopbacks(struct doca_pe *pe, struct doca_urom_worker *worker, uint64_t plugin)
{
	uint64_t done = 0, i;

	for (i = 0; i < LOOPBACKS; i++) {
		struct doca_urom_worker_cmd_task *task;
		struct doca_buf *payload;
		struct loopback *cmd;
		union doca_data data = {.ptr = &done};

		OK(doca_urom_worker_cmd_task_allocate_init(worker, plugin, &task));
		doca_urom_worker_cmd_task_set_cb(task, loopback_done);
		doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
		((uint64_t *)doca_urom_worker_cmd_task_get_user_data(task))[0] = 1000 + i;
		payload = doca_urom_worker_cmd_task_get_payload(task);
		OK(doca_buf_get_data(payload, (void **)&cmd));
		cmd->type = 0;
		cmd->data = 1000 + i;
		OK(doca_buf_set_data(payload, cmd, sizeof(*cmd)));
		OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
		while (done <= i)
			doca_pe_progress(pe);
	}
}

static uint64_t plugin_id(const struct doca_urom_service_plugin_info *plugins, size_t count,
			  const char *name)
{
	size_t i;

	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, name) == 0)
			return plugins[i].id;
	CHECK(0, "the service does not offer %s", name);
	return 0;
}

int main(int argc, char **argv)
{
	struct config cfg = {{0}};
	struct doca_pe *pe;
	struct doca_urom_service *service;
	struct doca_urom_worker *worker;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	const struct doca_urom_service_plugin_info *plugins;
	uint64_t graph, second = 0;
	size_t count;

	CHECK(strcmp(doca_version(), DOCA_VERSION_STRING) == 0, "doca_version()");
	CHECK(strcmp(doca_version_runtime(), doca_version()) == 0, "built against %s, runs on %s",
	      doca_version(), doca_version_runtime());
	CHECK(strcmp(urom_version_runtime(), UROM_VERSION_STRING) == 0, "urom %s, header %s",
	      urom_version_runtime(), UROM_VERSION_STRING);
	CHECK(DOCA_VERSION_EQ_CURRENT(DOCA_VERSION_MAJOR, DOCA_VERSION_MINOR, 0), "EQ_CURRENT");
	CHECK(DOCA_VERSION_LTE_CURRENT(2, 9, 0) && !DOCA_VERSION_LTE_CURRENT(99, 0, 0), "LTE_CURRENT");

	OK(doca_argp_init("installed", &cfg));
	register_flags();
	OK(doca_argp_start(argc, argv));

	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	ctx = doca_urom_service_as_ctx(service);
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_ctx_start(ctx));
	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	graph = plugin_id(plugins, count, "worker_graph");
	if (cfg.plugin[0] != 0)
		second = plugin_id(plugins, count, cfg.plugin);

	OK(doca_urom_worker_create(&worker));
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(pe, doca_urom_worker_as_ctx(worker)));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, 4));
	OK(doca_urom_worker_set_plugins(worker, graph | second));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(worker)));
	do {
		doca_pe_progress(pe);
		OK(doca_ctx_get_state(doca_urom_worker_as_ctx(worker), &state));
	} while (state == DOCA_CTX_STATE_STARTING);
	CHECK(state == DOCA_CTX_STATE_RUNNING, "the worker runs");

	loopbacks(pe, worker, graph);
	if (second != 0)
		loopbacks(pe, worker, second);

	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(doca_urom_worker_as_ctx(worker)));
	do {
		doca_pe_progress(pe);
		OK(doca_ctx_get_state(doca_urom_worker_as_ctx(worker), &state));
	} while (state != DOCA_CTX_STATE_IDLE);
	OK(doca_urom_worker_destroy(worker));
	OK(doca_ctx_stop(ctx));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
	OK(doca_argp_destroy());
	printf("installed ok: DOCA %s, urom %s, %d loopbacks through worker_graph%s%s\n",
	       doca_version_runtime(), urom_version_runtime(), LOOPBACKS, second ? " and " : "",
	       cfg.plugin);
	return 0;
}
