//! Golden byte vectors: every message of every family, written out by hand from the layouts in
//! the module docs, so that a change of format shows up as a failing test.

#![allow(dead_code)]

pub use urom_testkit::golden::hex;

/// Which decoder a vector is for; also the fuzz target its seed file goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Control,
    /// The daemon's link to a worker: its seeds go to the control target, which parses both.
    Link,
    Data,
    Gpu,
}

impl Family {
    pub fn fuzz_target(self) -> &'static str {
        match self {
            Family::Control | Family::Link => "control",
            Family::Data => "data",
            Family::Gpu => "gpu",
        }
    }
}

pub struct Golden {
    pub name: &'static str,
    pub family: Family,
    pub hex: &'static str,
}

impl Golden {
    pub fn bytes(&self) -> Vec<u8> {
        hex(self.hex)
    }
}

// Frame header: magic "UROM" | version 1 | kind | length | flags | seq.
pub const GOLDEN: &[Golden] = &[
    Golden {
        name: "hello",
        family: Family::Control,
        hex: "55524f4d 0100 0101 60000000 00000000 0100000000000000
              0100 0000 00100000 686f73742d61 00*58",
    },
    Golden {
        name: "auth_challenge",
        family: Family::Control,
        hex: "55524f4d 0100 0201 40000000 00000000 0100000000000000
              01000000 00000000
              000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    },
    Golden {
        name: "auth_response",
        family: Family::Control,
        hex: "55524f4d 0100 0301 40000000 00000000 0200000000000000
              02000000 00000000
              202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f",
    },
    Golden {
        name: "secret_proof",
        family: Family::Control,
        hex: "55524f4d 0100 0601 58000000 00000000 0200000000000000
              404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f
              606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f",
    },
    Golden {
        name: "service_proof",
        family: Family::Control,
        hex: "55524f4d 0100 0701 38000000 00000000 0200000000000000
              808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
    },
    Golden {
        name: "ack",
        family: Family::Control,
        hex: "55524f4d 0100 0401 18000000 00000000 0200000000000000",
    },
    Golden {
        name: "error",
        family: Family::Control,
        hex: "55524f4d 0100 0501 98000000 00000000 0300000000000000
              06000000 00000000 62616420637075736574 00*110",
    },
    Golden {
        name: "plugin_list_request",
        family: Family::Control,
        hex: "55524f4d 0100 1001 18000000 00000000 0400000000000000",
    },
    Golden {
        name: "plugin_list_reply",
        family: Family::Control,
        hex: "55524f4d 0100 1101 a0000000 00000000 0400000000000000
              02000000 00000000
              0100000000000000 0100000000000000 776f726b65725f6772617068 00*36
              0200000000000000 0201000000000000 776f726b65725f73616e64626f78 00*34",
    },
    Golden {
        name: "cpuset_request",
        family: Family::Control,
        hex: "55524f4d 0100 1201 18000000 00000000 0500000000000000",
    },
    Golden {
        name: "cpuset_reply",
        family: Family::Control,
        hex: "55524f4d 0100 1301 98000000 00000000 0500000000000000
              0f01 00*126",
    },
    Golden {
        name: "spawn_worker",
        family: Family::Control,
        hex: "55524f4d 0100 2001 c9000000 00000000 0600000000000000
              ffffffffffffffff 0300000000000000 01000000 40000000 02000000 00000000
              03 00*127
              0a00 5543585f544c533d7263
              0300 413d62",
    },
    Golden {
        name: "spawn_result",
        family: Family::Control,
        hex: "55524f4d 0100 2101 2f000000 00000000 0600000000000000
              0700000000000000 0100 0700 00000000 2f746d702f7737",
    },
    Golden {
        name: "destroy_worker",
        family: Family::Control,
        hex: "55524f4d 0100 2201 20000000 00000000 0700000000000000
              0700000000000000",
    },
    Golden {
        name: "workers_by_gid_request",
        family: Family::Control,
        hex: "55524f4d 0100 2301 20000000 00000000 0800000000000000
              01000000 00000000",
    },
    Golden {
        name: "workers_by_gid_reply",
        family: Family::Control,
        hex: "55524f4d 0100 2401 30000000 00000000 0800000000000000
              02000000 00000000 0100000000000000 0300000000000000",
    },
    Golden {
        name: "worker_exited",
        family: Family::Control,
        hex: "55524f4d 0100 2501 28000000 00000000 0000000000000000
              0300000000000000 00000000 09000000",
    },
    Golden {
        name: "status_request",
        family: Family::Control,
        hex: "55524f4d 0100 3001 20000000 00000000 0900000000000000
              00000000 00000000",
    },
    // Record: kind | len | fixed part | texts (u16 length, bytes).
    Golden {
        name: "status_reply",
        family: Family::Control,
        hex: "55524f4d 0100 3101 c3010000 00000000 0900000000000000
              09000000 00000000
              0100 3400 | 34120000 01000000 0068e5cf8b010000 60ea000000000000 00100000 40000000
                          02000000 00000000 0500 302e312e30 0300 302d33
              0200 1800 | 0100 0000 00000000 0e00 2f72756e2f75726f6d2e736f636b
              0300 1b00 | 0100 0100 00080000 00080000 f8070000 0900 2f6d6e742f68756765
              0400 0e00 | 0100 0000 00000000 0200 2f70 0000
              0500 3c00 | 0100 0000 00000000 0100000000000000 0100000000000000
                          0c00 776f726b65725f6772617068 1200 2f702f776f726b65725f67726170682e736f 0000
              0500 3200 | 0200 0000 00000000 0000000000000000 0000000000000000
                          0300 626164 0900 2f702f6261642e736f 0800 6e6f206966616365
              0600 3c00 | 0700000000000000 0100000000000000 30dde5cf8b010000 92100000 e8030000
                          03000000 0200 0000 01000000 00000000 0500 616c696365 0300 322d33
              0700 4800 | 0700000000000000 6400000000000000 6300000000000000 0200000000000000
                          0019000000000000 d81b000000000000 0000000000000000
                          01000000 0c000000 01000000 00000000
              0800 1800 | 0700000000000000 06000000 00000000 0200000000000000",
    },
    Golden {
        name: "counters_request",
        family: Family::Link,
        hex: "55524f4d 0100 0103 18000000 00000000 0100000000000000",
    },
    Golden {
        name: "counters_reply",
        family: Family::Link,
        hex: "55524f4d 0100 0203 88000000 00000000 0100000000000000
              0700000000000000 6400000000000000 6300000000000000 0200000000000000
              0019000000000000 d81b000000000000 0000000000000000
              01000000 0c000000 01000000 00000000
              02000000 00000000
              06000000 00000000 0100000000000000
              10000000 00000000 0100000000000000",
    },
    Golden {
        name: "command",
        family: Family::Data,
        hex: "55524f4d 0100 0102 40000000 00000000 0900000000000000
              0100000000000000 8877665544332211 1000000000000000
              0000000000000000 2a00000000000000",
    },
    Golden {
        name: "notify",
        family: Family::Data,
        hex: "55524f4d 0100 0302 40000000 00000000 0900000000000000
              0100000000000000 8877665544332211 00000000 00000000
              0000000000000000 2a00000000000000",
    },
    Golden {
        name: "notify_error_empty",
        family: Family::Data,
        hex: "55524f4d 0100 0302 30000000 00000000 0a00000000000000
              0200000000000000 0500000000000000 06000000 00000000",
    },
    Golden {
        name: "start_shutdown",
        family: Family::Gpu,
        hex: "00000008 00000000",
    },
    Golden {
        name: "shutdown_complete",
        family: Family::Gpu,
        hex: "00000008 00000001",
    },
    Golden {
        name: "consumer_id_request",
        family: Family::Gpu,
        hex: "0000000c 00000002 0000002a",
    },
    Golden {
        name: "consumer_id_response",
        family: Family::Gpu,
        hex: "0000000c 00000003 00000007",
    },
    Golden {
        name: "client_request",
        family: Family::Gpu,
        hex: "00000010 00000004 00000004 41424344",
    },
    Golden {
        name: "client_response",
        family: Family::Gpu,
        hex: "00000010 00000005 00000004 44434241",
    },
    Golden {
        name: "client_request_empty",
        family: Family::Gpu,
        hex: "0000000c 00000004 00000000",
    },
];

pub fn golden(name: &str) -> Vec<u8> {
    GOLDEN
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("no golden vector {name}"))
        .bytes()
}
