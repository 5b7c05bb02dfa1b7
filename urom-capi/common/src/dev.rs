//! Devices (`doca_dev.h`) as the UROM service file lists them.
//!
//! urom reaches its service through `DOCA_UROM_SERVICE_FILE`, whose lines
//! `<app_hostname> dpu <dev_hostname> <dev_pci_addr> <net,devs>` say which device serves which
//! host. The devices of this host are the network devices of its lines: one device per entry of
//! `<net,devs>` (`mlx5_0:1` is the InfiniBand device `mlx5_0`, port 1), with the line's PCI
//! address. Without the variable there are no devices. A device opened here is a name for its
//! line: `doca_urom_service_set_dev()` picks that line's service. No hardware is touched, so
//! what only hardware knows (interface names, representors, sub-functions) is
//! `DOCA_ERROR_NOT_SUPPORTED`.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use urom_capi_abi::Status;
use urom_host::{SERVICE_FILE_VAR, same_pci, service_lines};

use crate::log;

/// Marks a live device information object.
pub(crate) const DEVINFO_MAGIC: u64 = 0x7572_6f6d_6469_6e66; // "uromdinf"
/// Marks a live device.
pub(crate) const DEV_MAGIC: u64 = 0x7572_6f6d_6465_7631; // "uromdev1"

/// `DOCA_DEVINFO_IBDEV_NAME_SIZE`.
pub(crate) const IBDEV_NAME_SIZE: usize = 64;
/// `DOCA_DEVINFO_PCI_ADDR_SIZE`: `XXXX:XX:XX.X` and its NUL.
pub(crate) const PCI_ADDR_SIZE: usize = 13;

/// One device of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevInfo {
    /// `XXXX:XX:XX.X`, lower-case hex.
    pub(crate) pci: String,
    /// The InfiniBand device name (`mlx5_0`).
    pub(crate) ibdev: String,
}

/// `struct doca_devinfo`.
pub struct DevInfoObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) info: DevInfo,
}

impl DevInfoObj {
    /// The device information, if `info` points to a live one.
    pub(crate) fn check(info: Option<&Self>) -> Result<&Self, Status> {
        info.filter(|info| info.magic.get() == DEVINFO_MAGIC)
            .ok_or(Status::InvalidValue)
    }
}

/// `struct doca_dev`: an open device, holding its own copy of its information.
pub struct DevObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) info: DevInfoObj,
}

impl DevObj {
    pub(crate) fn open(info: &DevInfoObj) -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(DEV_MAGIC),
            info: DevInfoObj {
                magic: Cell::new(DEVINFO_MAGIC),
                info: info.info.clone(),
            },
        })
    }

    /// The device, if `dev` points to a live one.
    pub(crate) fn check(dev: Option<&Self>) -> Result<&Self, Status> {
        dev.filter(|dev| dev.magic.get() == DEV_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
        self.info.magic.set(0);
    }
}

/// `0000:03:00.0` for `03:00.0` or `0000:03:00.0`, lower case.
pub(crate) fn full_pci(pci: &str) -> String {
    let pci = pci.to_ascii_lowercase();
    if pci.matches(':').count() == 1 {
        format!("0000:{pci}")
    } else {
        pci
    }
}

/// This host's devices, from the service file.
pub(crate) fn devices() -> Result<Vec<DevInfo>, Status> {
    let Some(file) = std::env::var_os(SERVICE_FILE_VAR).map(PathBuf::from) else {
        return Ok(Vec::new());
    };
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_default();
    let lines = service_lines(&file, &hostname).map_err(|e| {
        log::sdk(log::ERROR, "devices", &e.to_string());
        Status::NotFound
    })?;
    let mut devices = Vec::new();
    for line in lines {
        let pci = full_pci(&line.dev_pci_addr);
        if line.net_devs.is_empty() {
            devices.push(DevInfo {
                pci,
                ibdev: String::new(),
            });
            continue;
        }
        for dev in &line.net_devs {
            let ibdev = dev.split_once(':').map_or(dev.as_str(), |(name, _)| name);
            devices.push(DevInfo {
                pci: pci.clone(),
                ibdev: ibdev.to_owned(),
            });
        }
    }
    Ok(devices)
}

/// A device list handed to C: the array of handles and the objects they point to.
pub(crate) struct DevList {
    /// Handle addresses, as C reads them (`struct doca_devinfo *[]`).
    pub(crate) handles: Box<[usize]>,
    /// Never resized: each object's address is its handle.
    infos: Vec<DevInfoObj>,
}

impl DevList {
    pub(crate) fn new(devices: Vec<DevInfo>) -> Self {
        let infos: Vec<DevInfoObj> = devices
            .into_iter()
            .map(|info| DevInfoObj {
                magic: Cell::new(DEVINFO_MAGIC),
                info,
            })
            .collect();
        let handles = infos
            .iter()
            .map(|info| info as *const DevInfoObj as usize)
            .collect();
        Self { handles, infos }
    }
}

/// The lists handed out, by the address of their handle array.
static LISTS: Mutex<Option<HashMap<usize, DevList>>> = Mutex::new(None);

fn lists() -> MutexGuard<'static, Option<HashMap<usize, DevList>>> {
    LISTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps `list` until [`release_list`]; returns the address of its handle array.
pub(crate) fn keep_list(list: DevList) -> usize {
    let key = list.handles.as_ptr() as usize;
    lists().get_or_insert_with(HashMap::new).insert(key, list);
    key
}

/// Frees the list whose handle array is at `key`.
pub(crate) fn release_list(key: usize) -> Result<(), Status> {
    let list = lists()
        .as_mut()
        .and_then(|lists| lists.remove(&key))
        .ok_or(Status::InvalidValue)?;
    for info in &list.infos {
        info.magic.set(0);
    }
    Ok(())
}

/// Writes `text` and a NUL into `out` if it fits.
pub(crate) fn copy_c_string(text: &str, out: &mut [u8]) -> Result<(), Status> {
    let bytes = text.as_bytes();
    if bytes.len() >= out.len() {
        return Err(Status::InvalidValue);
    }
    out[..bytes.len()].copy_from_slice(bytes);
    out[bytes.len()] = 0;
    Ok(())
}

/// Whether `pci` (`XXXX:XX:XX.X` or `XX:XX.X`) names `info`'s device.
pub(crate) fn pci_matches(info: &DevInfo, pci: &str) -> bool {
    same_pci(pci, &info.pci)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_get_a_domain() {
        assert_eq!(full_pci("03:00.0"), "0000:03:00.0");
        assert_eq!(full_pci("0000:3A:00.1"), "0000:3a:00.1");
        let info = DevInfo {
            pci: full_pci("3a:00.1"),
            ibdev: "mlx5_1".into(),
        };
        assert!(pci_matches(&info, "3A:00.1"));
        assert!(pci_matches(&info, "0000:3a:00.1"));
        assert!(!pci_matches(&info, "0000:3a:00.0"));
    }

    #[test]
    fn lists_are_released_once() {
        let list = DevList::new(vec![DevInfo {
            pci: "0000:03:00.0".into(),
            ibdev: "mlx5_0".into(),
        }]);
        let key = keep_list(list);
        assert_eq!(release_list(key), Ok(()));
        assert_eq!(release_list(key), Err(Status::InvalidValue));
    }

    #[test]
    fn c_strings_need_room_for_the_nul() {
        let mut out = [0xa5u8; 7];
        assert_eq!(copy_c_string("mlx5_0", &mut out), Ok(()));
        assert_eq!(&out, b"mlx5_0\0");
        assert_eq!(
            copy_c_string("mlx5_10", &mut out),
            Err(Status::InvalidValue)
        );
    }
}
