//! `doca_dev.h`: this host's devices, from the UROM service file.

use std::ffi::c_char;

use urom_capi_abi::{DocaError, Status};

use super::{arg, guard, guard_value, out_bytes, reclaim, text};
use crate::dev::{
    DevInfoObj, DevList, DevObj, IBDEV_NAME_SIZE, PCI_ADDR_SIZE, copy_c_string, devices, keep_list,
    pci_matches, release_list,
};

/// `DOCA_PCI_FUNC_TYPE_PF`.
const PCI_FUNC_TYPE_PF: u32 = 0;

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_create_list(
    dev_list: Option<&mut *mut *mut DevInfoObj>,
    nb_devs: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let (out, count) = (arg(dev_list)?, arg(nb_devs)?);
        let list = DevList::new(devices()?);
        let len = u32::try_from(list.handles.len()).map_err(|_| Status::NoMemory)?;
        let key = keep_list(list);
        *out = key as *mut *mut DevInfoObj;
        *count = len;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_destroy_list(dev_list: *mut *mut DevInfoObj) -> DocaError {
    guard(|| release_list(dev_list as usize))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_dev_open(
    devinfo: Option<&DevInfoObj>,
    dev: Option<&mut *mut DevObj>,
) -> DocaError {
    guard(|| {
        let info = DevInfoObj::check(devinfo)?;
        *arg(dev)? = Box::into_raw(DevObj::open(info));
        Ok(())
    })
}

/// Closes a device from `doca_dev_open`.
///
/// # Safety
///
/// `dev` is NULL or a live device from `doca_dev_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_dev_close(dev: *mut DevObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live device.
        let live = DevObj::check(unsafe { dev.as_ref() })?;
        live.retire();
        // SAFETY: devices come from `Box::into_raw` in `doca_dev_open`.
        drop(unsafe { reclaim(dev) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_dev_as_devinfo(dev: Option<&DevObj>) -> *mut DevInfoObj {
    guard_value(std::ptr::null_mut(), || match DevObj::check(dev) {
        Ok(dev) => &dev.info as *const DevInfoObj as *mut DevInfoObj,
        Err(_) => std::ptr::null_mut(),
    })
}

/// Writes the device's PCI address, `XXXX:XX:XX.X`, into `DOCA_DEVINFO_PCI_ADDR_SIZE` bytes.
///
/// # Safety
///
/// `pci_addr_str` is NULL or points to at least `DOCA_DEVINFO_PCI_ADDR_SIZE` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_devinfo_get_pci_addr_str(
    devinfo: Option<&DevInfoObj>,
    pci_addr_str: *mut c_char,
) -> DocaError {
    guard(|| {
        let info = DevInfoObj::check(devinfo)?;
        // SAFETY: the caller passes NULL or DOCA_DEVINFO_PCI_ADDR_SIZE writable bytes.
        let out = unsafe { out_bytes(pci_addr_str, PCI_ADDR_SIZE) }.ok_or(Status::InvalidValue)?;
        copy_c_string(&info.info.pci, out)
    })
}

/// # Safety
///
/// `pci_addr_str` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_devinfo_is_equal_pci_addr(
    devinfo: Option<&DevInfoObj>,
    pci_addr_str: *const c_char,
    is_equal: Option<&mut u8>,
) -> DocaError {
    guard(|| {
        let info = DevInfoObj::check(devinfo)?;
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let pci = unsafe { text(pci_addr_str) }.ok_or(Status::InvalidValue)?;
        *arg(is_equal)? = u8::from(pci_matches(&info.info, &pci));
        Ok(())
    })
}

/// Writes the InfiniBand device name; `size` must be at least `DOCA_DEVINFO_IBDEV_NAME_SIZE`.
///
/// # Safety
///
/// `ibdev_name` is NULL or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_devinfo_get_ibdev_name(
    devinfo: Option<&DevInfoObj>,
    ibdev_name: *mut c_char,
    size: u32,
) -> DocaError {
    guard(|| {
        let info = DevInfoObj::check(devinfo)?;
        let size = usize::try_from(size).map_err(|_| Status::InvalidValue)?;
        if size < IBDEV_NAME_SIZE {
            return Err(Status::InvalidValue);
        }
        // SAFETY: the caller passes NULL or `size` writable bytes.
        let out = unsafe { out_bytes(ibdev_name, size) }.ok_or(Status::InvalidValue)?;
        copy_c_string(&info.info.ibdev, out)
    })
}

/// Interface names live on the device's host; the service file does not say them.
#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_get_iface_name(
    devinfo: Option<&DevInfoObj>,
    iface_name: *mut c_char,
    _size: u32,
) -> DocaError {
    guard(|| {
        DevInfoObj::check(devinfo)?;
        if iface_name.is_null() {
            return Err(Status::InvalidValue);
        }
        Err(Status::NotSupported)
    })
}

/// Every device of the service file is a physical function.
#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_get_pci_func_type(
    devinfo: Option<&DevInfoObj>,
    pci_func_type: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        DevInfoObj::check(devinfo)?;
        *arg(pci_func_type)? = PCI_FUNC_TYPE_PF;
        Ok(())
    })
}

/// Only sub-functions have an index; these devices are physical functions.
#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_get_sf_index(
    devinfo: Option<&DevInfoObj>,
    sf_index: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        DevInfoObj::check(devinfo)?;
        arg(sf_index)?;
        Err(Status::NotSupported)
    })
}

// Representors exist on the device's side; a host's devices expose none.

/// Opaque `struct doca_devinfo_rep`: never made.
pub struct DevInfoRep {
    _never: (),
}

/// Opaque `struct doca_dev_rep`: never made.
pub struct DevRep {
    _never: (),
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_create_list(
    dev: Option<&DevObj>,
    _filter: i32,
    dev_list_rep: Option<&mut *mut *mut DevInfoRep>,
    nb_devs_rep: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        DevObj::check(dev)?;
        *arg(dev_list_rep)? = std::ptr::null_mut();
        *arg(nb_devs_rep)? = 0;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_destroy_list(dev_list_rep: *mut *mut DevInfoRep) -> DocaError {
    guard(|| {
        if dev_list_rep.is_null() {
            return Err(Status::InvalidValue);
        }
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_get_vuid(
    devinfo_rep: Option<&DevInfoRep>,
    _rep_vuid: *mut c_char,
    _size: u32,
) -> DocaError {
    guard(|| {
        arg(devinfo_rep)?;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_get_pci_addr_str(
    devinfo_rep: Option<&DevInfoRep>,
    _pci_addr_str: *mut c_char,
) -> DocaError {
    guard(|| {
        arg(devinfo_rep)?;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_get_pci_func_type(
    devinfo_rep: Option<&DevInfoRep>,
    _pci_func_type: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        arg(devinfo_rep)?;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_devinfo_rep_is_equal_pci_addr(
    devinfo_rep: Option<&DevInfoRep>,
    _pci_addr_str: *const c_char,
    _is_equal: Option<&mut u8>,
) -> DocaError {
    guard(|| {
        arg(devinfo_rep)?;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_dev_rep_open(
    devinfo: Option<&DevInfoRep>,
    _dev_rep: Option<&mut *mut DevRep>,
) -> DocaError {
    guard(|| {
        arg(devinfo)?;
        Err(Status::NotSupported)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_dev_rep_close(dev: Option<&DevRep>) -> DocaError {
    guard(|| {
        arg(dev)?;
        Err(Status::NotSupported)
    })
}
