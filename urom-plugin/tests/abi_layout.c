/*
 * Prints the layout of the plugin interface as plugins/include/doca_urom_plugin.h declares it,
 * one "key value" line per size, offset and constant, then a "code CONSTANT value name" line
 * per status code; tests/abi_layout.rs compares the lines with the Rust side.
 */
#include <doca_error.h>
#include <doca_compat.h>
#include <doca_urom_plugin.h>

#include <stdio.h>

#define SIZE(_type) printf("sizeof(%s) %zu\n", #_type, sizeof(_type))
#define OFFSET(_type, _member) printf("offsetof(%s, %s) %zu\n", #_type, #_member, offsetof(_type, _member))

int main(void)
{
	struct urom_plugin_iface iface = {0};
	int code;

	SIZE(ucs_list_link_t);
	OFFSET(ucs_list_link_t, prev);
	OFFSET(ucs_list_link_t, next);

	SIZE(struct urom_worker_cmd);
	OFFSET(struct urom_worker_cmd, type);
	OFFSET(struct urom_worker_cmd, urom_context);
	OFFSET(struct urom_worker_cmd, len);
	OFFSET(struct urom_worker_cmd, plugin_cmd);

	SIZE(struct urom_worker_notify);
	OFFSET(struct urom_worker_notify, type);
	OFFSET(struct urom_worker_notify, urom_context);
	OFFSET(struct urom_worker_notify, len);
	OFFSET(struct urom_worker_notify, status);
	OFFSET(struct urom_worker_notify, reserved);
	OFFSET(struct urom_worker_notify, plugin_notif);

	SIZE(struct urom_worker_cmd_desc);
	OFFSET(struct urom_worker_cmd_desc, entry);
	OFFSET(struct urom_worker_cmd_desc, dest_id);
	OFFSET(struct urom_worker_cmd_desc, worker_cmd);

	SIZE(struct urom_worker_notif_desc);
	OFFSET(struct urom_worker_notif_desc, entry);
	OFFSET(struct urom_worker_notif_desc, dest_id);
	OFFSET(struct urom_worker_notif_desc, worker_notif);

	SIZE(struct urom_plugin_iface);
	OFFSET(struct urom_plugin_iface, __doca_api_version);
	OFFSET(struct urom_plugin_iface, open);
	OFFSET(struct urom_plugin_iface, close);
	OFFSET(struct urom_plugin_iface, addr);
	OFFSET(struct urom_plugin_iface, worker_cmd);
	OFFSET(struct urom_plugin_iface, progress);
	OFFSET(struct urom_plugin_iface, notif_pack);

	SIZE(struct urom_domain_lookups_iface);
	OFFSET(struct urom_domain_lookups_iface, addr_lookup);
	OFFSET(struct urom_domain_lookups_iface, seg_lookup);
	OFFSET(struct urom_domain_lookups_iface, memh_lookup);
	OFFSET(struct urom_domain_lookups_iface, mkey_lookup);

	SIZE(struct urom_worker_ctx);
	OFFSET(struct urom_worker_ctx, iface);
	OFFSET(struct urom_worker_ctx, domain_iface);
	OFFSET(struct urom_worker_ctx, plugin_ctx);

	SIZE(struct doca_urom_service_plugin_info);
	OFFSET(struct doca_urom_service_plugin_info, id);
	OFFSET(struct doca_urom_service_plugin_info, version);
	OFFSET(struct doca_urom_service_plugin_info, plugin_name);

	SIZE(doca_error_t);
	printf("DOCA_UROM_PLUGIN_NAME_MAX_LEN %d\n", DOCA_UROM_PLUGIN_NAME_MAX_LEN);
	DOCA_STRUCT_CTOR(iface);
	printf("DOCA_STRUCT_CTOR %zu\n", DOCA_STRUCT_GET_VERSION(&iface));

	/* Every code the header names: the constant, its value, and the name looked up by value. */
#define CODE(_code, _descr) printf("code %s %d %s\n", #_code, (int)(_code), doca_error_get_name(_code));
	UROM_DOCA_ERROR_TABLE_(CODE)
	code = DOCA_ERROR_DEVICE_FATAL_ERROR + 1;
	printf("code (none) %d %s\n", code, doca_error_get_name((doca_error_t)code));
	return 0;
}
