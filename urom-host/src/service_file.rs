//! `DOCA_UROM_SERVICE_FILE`: which service serves this host.
//!
//! One line per host: `<app_hostname> <service_type> <dev_hostname> <dev_pci_addr> <net,devs>`,
//! the type being `dpu`. Blank lines and lines starting with `#` are ignored.

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming the service file.
pub const SERVICE_FILE_VAR: &str = "DOCA_UROM_SERVICE_FILE";

/// One line of a service file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLine {
    /// The host this line applies to.
    pub app_hostname: String,
    /// The service type (`dpu`).
    pub service_type: String,
    /// Where the service runs.
    pub dev_hostname: String,
    /// The PCI address of the device.
    pub dev_pci_addr: String,
    /// Network devices shared between host and device.
    pub net_devs: Vec<String>,
}

/// Why no service could be found in a service file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceFileError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// A line is not a valid service line.
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// No line is for this host (and device).
    NoMatch {
        /// The file.
        path: PathBuf,
        /// This host's name.
        hostname: String,
    },
}

impl fmt::Display for ServiceFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, reason } => {
                write!(f, "cannot read service file {}: {reason}", path.display())
            }
            Self::Malformed { path, line, what } => write!(f, "{}:{line}: {what}", path.display()),
            Self::NoMatch { path, hostname } => write!(
                f,
                "{}: no line for host {hostname} (lines read `<app_hostname> dpu <dev_hostname> <dev_pci_addr> <net,devs>`)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ServiceFileError {}

/// Parses `text`; the first malformed line is an error.
fn parse(path: &Path, text: &str) -> Result<Vec<ServiceLine>, ServiceFileError> {
    let mut lines = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let malformed = |what: String| ServiceFileError::Malformed {
            path: path.to_owned(),
            line: index + 1,
            what,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [app, kind, dev, pci, devs] = fields[..] else {
            return Err(malformed(format!(
                "expected 5 fields `<app_hostname> <service_type> <dev_hostname> <dev_pci_addr> <net,devs>`, found {}",
                fields.len()
            )));
        };
        if kind != "dpu" {
            return Err(malformed(format!("service type `{kind}` is not `dpu`")));
        }
        if !is_pci_address(pci) {
            return Err(malformed(format!(
                "`{pci}` is not a PCI address like 03:00.0"
            )));
        }
        lines.push(ServiceLine {
            app_hostname: app.to_owned(),
            service_type: kind.to_owned(),
            dev_hostname: dev.to_owned(),
            dev_pci_addr: pci.to_owned(),
            net_devs: devs
                .split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect(),
        });
    }
    Ok(lines)
}

/// `bus:device.function`, optionally after a domain: `03:00.0`, `0000:03:00.0`.
fn is_pci_address(text: &str) -> bool {
    let hex =
        |part: &str, len: usize| part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = text.split(':').collect();
    let (bus, rest) = match parts[..] {
        [bus, rest] => (bus, rest),
        [domain, bus, rest] if hex(domain, 4) => (bus, rest),
        _ => return false,
    };
    match rest.split_once('.') {
        Some((device, function)) => {
            hex(bus, 2) && hex(device, 2) && function.len() == 1 && hex(function, 1)
        }
        None => false,
    }
}

/// Whether two PCI addresses name the same function: the domain defaults to `0000` and hex
/// digits compare without case (`03:00.0` is `0000:03:00.0`, as DOCA writes it).
pub fn same_pci(a: &str, b: &str) -> bool {
    let full = |pci: &str| {
        let pci = pci.to_ascii_lowercase();
        if pci.matches(':').count() == 1 {
            format!("0000:{pci}")
        } else {
            pci
        }
    };
    full(a) == full(b)
}

/// Every line of service file `path` for `hostname`, in file order (none is no error).
pub fn service_lines(path: &Path, hostname: &str) -> Result<Vec<ServiceLine>, ServiceFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ServiceFileError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(parse(path, &text)?
        .into_iter()
        .filter(|line| line.app_hostname == hostname)
        .collect())
}

/// The line of service file `path` for `hostname` (and `pci`, when given).
pub fn lookup_service(
    path: &Path,
    hostname: &str,
    pci: Option<&str>,
) -> Result<ServiceLine, ServiceFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ServiceFileError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    parse(path, &text)?
        .into_iter()
        .find(|line| {
            line.app_hostname == hostname && pci.is_none_or(|pci| same_pci(&line.dev_pci_addr, pci))
        })
        .ok_or_else(|| ServiceFileError::NoMatch {
            path: path.to_owned(),
            hostname: hostname.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(text: &str, host: &str, pci: Option<&str>) -> Result<ServiceLine, ServiceFileError> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("urom-service-file-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("service.txt");
        std::fs::write(&path, text).unwrap();
        let result = lookup_service(&path, host, pci);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    #[test]
    fn valid_lines_with_comments_and_blanks() {
        let text = "# hosts of rack 1\n\nnode1 dpu node1-bf 03:00.0 mlx5_0,mlx5_1\nnode2 dpu node2-bf 0000:04:00.1 mlx5_2\n";
        let line = lookup(text, "node2", None).unwrap();
        assert_eq!(line.dev_hostname, "node2-bf");
        assert_eq!(line.net_devs, vec!["mlx5_2"]);
        assert_eq!(
            lookup(text, "node1", Some("03:00.0"))
                .unwrap()
                .net_devs
                .len(),
            2
        );
    }

    #[test]
    fn malformed_lines_name_file_line_and_problem() {
        let error = lookup("node1 dpu node1-bf 03:00.0\n", "node1", None).unwrap_err();
        assert!(
            matches!(error, ServiceFileError::Malformed { line: 1, .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains(":1: expected 5 fields"),
            "{error}"
        );
        let error = lookup("# c\nnode1 gpu node1-bf 03:00.0 d\n", "node1", None).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(":2: service type `gpu` is not `dpu`"),
            "{error}"
        );
        let error = lookup("node1 dpu node1-bf 3:0.0 d\n", "node1", None).unwrap_err();
        assert!(
            error.to_string().contains("is not a PCI address"),
            "{error}"
        );
    }

    #[test]
    fn every_line_of_a_host() {
        let dir = std::env::temp_dir().join(format!("urom-service-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("service.txt");
        let text = "node1 dpu bf1 03:00.0 mlx5_0\nnode2 dpu bf2 04:00.0 mlx5_1\nnode1 dpu bf3 05:00.0 mlx5_2:1,mlx5_3:1\n";
        std::fs::write(&path, text).unwrap();
        let lines = service_lines(&path, "node1").unwrap();
        let pcis: Vec<&str> = lines.iter().map(|l| l.dev_pci_addr.as_str()).collect();
        assert_eq!(pcis, ["03:00.0", "05:00.0"]);
        assert!(service_lines(&path, "node9").unwrap().is_empty());
        std::fs::write(&path, "node1 dpu bf1 03:00.0\n").unwrap();
        assert!(matches!(
            service_lines(&path, "node9"),
            Err(ServiceFileError::Malformed { line: 1, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_match_names_the_host() {
        let error = lookup("node1 dpu node1-bf 03:00.0 d\n", "node9", None).unwrap_err();
        assert!(matches!(error, ServiceFileError::NoMatch { .. }));
        assert!(
            error.to_string().contains("no line for host node9"),
            "{error}"
        );
        assert!(
            lookup(
                "node1 dpu node1-bf 03:00.0 d\n",
                "node1",
                Some("0000:03:00.0")
            )
            .is_ok()
        );
        assert!(
            lookup(
                "node1 dpu node1-bf 0000:3A:00.1 d\n",
                "node1",
                Some("3a:00.1")
            )
            .is_ok()
        );
        let error = lookup("node1 dpu node1-bf 03:00.0 d\n", "node1", Some("04:00.0")).unwrap_err();
        assert!(matches!(error, ServiceFileError::NoMatch { .. }));
    }
}
