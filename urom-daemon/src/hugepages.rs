//! Which pages worker rings go on: what the system has reserved, what the operator asked for.
//!
//! The rings of a host's channel live in a memory file the worker creates; with hugepages
//! reserved (`nr_hugepages`, as the service guide has the operator do) the worker puts them on
//! hugepages from that pool (`memfd_create` with `MFD_HUGETLB`, which needs no mount of its
//! own; a hugetlbfs mount such as `/mnt/huge` draws from the same pool and is reported). The
//! daemon reads the pool once at startup, says what rings will use, refuses to start when
//! `--hugepages require` cannot be met, and passes the choice on to every worker.

use std::fmt;

use urom_transport::shm::HugePages;
use urom_wire::report::HugePagesMode;

/// The system's hugepage pool, as `/proc/meminfo` and `/proc/mounts` describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HugePagePool {
    /// The default hugepage size in KiB; 0 when the kernel has none.
    pub page_kib: u32,
    /// Hugepages reserved.
    pub total: u32,
    /// Of those, free.
    pub free: u32,
    /// Where hugetlbfs is mounted.
    pub mounts: Vec<String>,
}

impl HugePagePool {
    /// Reads the pool of this system; what cannot be read counts as none.
    pub fn read() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        Self::parse(&meminfo, &mounts)
    }

    /// The pool from the text of `/proc/meminfo` and `/proc/mounts`.
    pub fn parse(meminfo: &str, mounts: &str) -> Self {
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Self {
            page_kib: field("Hugepagesize"),
            total: field("HugePages_Total"),
            free: field("HugePages_Free"),
            mounts: mounts
                .lines()
                .filter_map(|line| {
                    let mut fields = line.split_whitespace();
                    let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
                    (kind == "hugetlbfs").then(|| point.replace("\\040", " "))
                })
                .collect(),
        }
    }
}

/// What worker rings use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugePagesPlan {
    /// What the operator asked for.
    pub choice: HugePages,
    /// The pool at startup.
    pub pool: HugePagePool,
}

/// `--hugepages require` on a system with no free hugepages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugePagesMissing;

impl fmt::Display for HugePagesMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "--hugepages require, but no hugepages are free: reserve some first, e.g. \
             `echo 2048 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`",
        )
    }
}

impl std::error::Error for HugePagesMissing {}

impl HugePagesPlan {
    /// The plan for `choice` on a system with `pool`.
    pub fn new(choice: HugePages, pool: HugePagePool) -> Result<Self, HugePagesMissing> {
        if choice == HugePages::Require && pool.free == 0 {
            return Err(HugePagesMissing);
        }
        Ok(Self { choice, pool })
    }

    /// Whether new rings go on hugepages (while the pool lasts).
    pub fn usable(&self) -> bool {
        self.choice != HugePages::Never && self.pool.free > 0
    }

    /// The choice as the status report names it.
    pub fn mode(&self) -> HugePagesMode {
        match self.choice {
            HugePages::Auto => HugePagesMode::Auto,
            HugePages::Never => HugePagesMode::Never,
            HugePages::Require => HugePagesMode::Require,
        }
    }

    /// One line for the log: what rings use and why.
    pub fn describe(&self) -> String {
        let pool = &self.pool;
        let mounts = if pool.mounts.is_empty() {
            "no hugetlbfs mount".to_owned()
        } else {
            format!("hugetlbfs at {}", pool.mounts.join(", "))
        };
        match (self.choice, pool.total) {
            (HugePages::Never, _) => format!(
                "worker rings use normal pages (--hugepages never; {} of {} hugepages free, {mounts})",
                pool.free, pool.total
            ),
            (_, 0) => format!(
                "no hugepages reserved ({mounts}): worker rings use normal pages, transparent \
                 hugepages advised; reserve some with /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages",
                if pool.page_kib == 0 {
                    2048
                } else {
                    pool.page_kib
                }
            ),
            _ if pool.free == 0 => format!(
                "all {} hugepages are in use ({mounts}): worker rings use normal pages until some are free",
                pool.total
            ),
            _ => format!(
                "worker rings use hugepages: {} of {} free, {} KiB each, {mounts}",
                pool.free, pool.total, pool.page_kib
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24000000 kB\nHugePages_Total:    2048\n\
                           HugePages_Free:     2040\nHugePages_Rsvd:        0\n\
                           Hugepagesize:       2048 kB\n";
    const MOUNTS: &str = "proc /proc proc rw 0 0\nnodev /mnt/huge hugetlbfs rw,pagesize=2M 0 0\n\
                          hugetlbfs /dev/hugepages hugetlbfs rw 0 0\n";

    #[test]
    fn the_pool_is_read_from_meminfo_and_mounts() {
        let pool = HugePagePool::parse(MEMINFO, MOUNTS);
        assert_eq!(
            pool,
            HugePagePool {
                page_kib: 2048,
                total: 2048,
                free: 2040,
                mounts: vec!["/mnt/huge".into(), "/dev/hugepages".into()],
            }
        );
        assert_eq!(HugePagePool::parse("", ""), HugePagePool::default());
    }

    #[test]
    fn the_plan_follows_the_choice_and_the_pool() {
        let pool = HugePagePool::parse(MEMINFO, MOUNTS);
        let auto = HugePagesPlan::new(HugePages::Auto, pool.clone()).unwrap();
        assert!(auto.usable());
        assert!(
            auto.describe().contains("2040 of 2048 free"),
            "{}",
            auto.describe()
        );
        assert!(auto.describe().contains("/mnt/huge"));
        let never = HugePagesPlan::new(HugePages::Never, pool).unwrap();
        assert!(!never.usable());
        let none = HugePagePool::default();
        let fallback = HugePagesPlan::new(HugePages::Auto, none.clone()).unwrap();
        assert!(!fallback.usable());
        assert!(fallback.describe().contains("no hugepages reserved"));
        assert_eq!(
            HugePagesPlan::new(HugePages::Require, none),
            Err(HugePagesMissing)
        );
    }
}
