/*
 * doca_dev.h - devices, as the UROM service file lists them.
 *
 * The devices of this host are the network devices of its lines in DOCA_UROM_SERVICE_FILE
 * (`<app_hostname> dpu <dev_hostname> <dev_pci_addr> <net,devs>`): one device per entry of
 * `<net,devs>` (`mlx5_0:1` is InfiniBand device `mlx5_0`, port 1) with the line's PCI address.
 * Without the variable the list is empty; a malformed file gives DOCA_ERROR_NOT_FOUND and an SDK
 * log line naming the file and line. Opening a device touches no hardware: it names the line
 * doca_urom_service_set_dev() will use. Interface names, sub-function indexes and representors
 * belong to the hardware and are DOCA_ERROR_NOT_SUPPORTED; every device is a physical function.
 */
#ifndef DOCA_DEV_H_
#define DOCA_DEV_H_

#include <stdint.h>

#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct doca_devinfo;
struct doca_devinfo_rep;
struct doca_dev;
struct doca_dev_rep;

/* Representor filters. */
enum doca_devinfo_rep_filter {
	DOCA_DEVINFO_REP_FILTER_ALL = 0,
	DOCA_DEVINFO_REP_FILTER_NET = 1 << 1,
	DOCA_DEVINFO_REP_FILTER_EMULATED = 1 << 2,
};

#define DOCA_DEVINFO_VUID_SIZE 128
#define DOCA_DEVINFO_IPV4_ADDR_SIZE 4
#define DOCA_DEVINFO_IPV6_ADDR_SIZE 16
#define DOCA_DEVINFO_MAC_ADDR_SIZE 6
#define DOCA_DEVINFO_IFACE_NAME_SIZE 256
#define DOCA_DEVINFO_IBDEV_NAME_SIZE 64
#define DOCA_DEVINFO_PCI_ADDR_SIZE 13
#define DOCA_DEVINFO_PCI_BDF_SIZE 8
#define DOCA_DEVINFO_REP_VUID_SIZE 128
#define DOCA_DEVINFO_REP_PCI_ADDR_SIZE 13
#define DOCA_DEVINFO_REP_PCI_BDF_SIZE 8

/* The devices of this host; free the list with doca_devinfo_destroy_list(). */
DOCA_STABLE
doca_error_t doca_devinfo_create_list(struct doca_devinfo ***dev_list, uint32_t *nb_devs);

DOCA_STABLE
doca_error_t doca_devinfo_destroy_list(struct doca_devinfo **dev_list);

DOCA_STABLE
doca_error_t doca_dev_open(struct doca_devinfo *devinfo, struct doca_dev **dev);

DOCA_STABLE
doca_error_t doca_dev_close(struct doca_dev *dev);

/* The information of an open device (valid while it is open). */
DOCA_STABLE
struct doca_devinfo *doca_dev_as_devinfo(const struct doca_dev *dev);

/* `XXXX:XX:XX.X` into DOCA_DEVINFO_PCI_ADDR_SIZE bytes. */
DOCA_STABLE
doca_error_t doca_devinfo_get_pci_addr_str(const struct doca_devinfo *devinfo, char *pci_addr_str);

/* Whether `XXXX:XX:XX.X` or `XX:XX.X` names the device. */
DOCA_STABLE
doca_error_t doca_devinfo_is_equal_pci_addr(const struct doca_devinfo *devinfo,
					    const char *pci_addr_str,
					    uint8_t *is_equal);

/* `size` must be at least DOCA_DEVINFO_IBDEV_NAME_SIZE. */
DOCA_STABLE
doca_error_t doca_devinfo_get_ibdev_name(const struct doca_devinfo *devinfo, char *ibdev_name, uint32_t size);

/* DOCA_ERROR_NOT_SUPPORTED: the service file does not name interfaces. */
DOCA_STABLE
doca_error_t doca_devinfo_get_iface_name(const struct doca_devinfo *devinfo, char *iface_name, uint32_t size);

/* DOCA_PCI_FUNC_TYPE_PF. */
DOCA_STABLE
doca_error_t doca_devinfo_get_pci_func_type(const struct doca_devinfo *devinfo,
					    enum doca_pci_func_type *pci_func_type);

/* DOCA_ERROR_NOT_SUPPORTED: the devices are physical functions. */
DOCA_STABLE
doca_error_t doca_devinfo_get_sf_index(const struct doca_devinfo *devinfo, uint32_t *sf_index);

/* Representors: DOCA_ERROR_NOT_SUPPORTED (a host's devices expose none). */
DOCA_STABLE
doca_error_t doca_devinfo_rep_create_list(struct doca_dev *dev,
					  int filter,
					  struct doca_devinfo_rep ***dev_list_rep,
					  uint32_t *nb_devs_rep);

DOCA_STABLE
doca_error_t doca_devinfo_rep_destroy_list(struct doca_devinfo_rep **dev_list_rep);

DOCA_STABLE
doca_error_t doca_dev_rep_open(struct doca_devinfo_rep *devinfo, struct doca_dev_rep **dev_rep);

DOCA_STABLE
doca_error_t doca_dev_rep_close(struct doca_dev_rep *dev);

DOCA_STABLE
doca_error_t doca_devinfo_rep_get_vuid(const struct doca_devinfo_rep *devinfo_rep, char *rep_vuid, uint32_t size);

DOCA_STABLE
doca_error_t doca_devinfo_rep_get_pci_addr_str(const struct doca_devinfo_rep *devinfo_rep, char *pci_addr_str);

DOCA_STABLE
doca_error_t doca_devinfo_rep_get_pci_func_type(const struct doca_devinfo_rep *devinfo_rep,
						enum doca_pci_func_type *pci_func_type);

DOCA_STABLE
doca_error_t doca_devinfo_rep_is_equal_pci_addr(const struct doca_devinfo_rep *devinfo_rep,
						const char *pci_addr_str,
						uint8_t *is_equal);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_DEV_H_ */
