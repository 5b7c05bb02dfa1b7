//! The domain decoders (the data-channel messages of a domain start, the table and its
//! records, the allgather blocks, the socket rendezvous): any bytes either fail with an error
//! or parse to something that emits back to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::domain::{
    Buffer, DomainMessage, JoinBlock, MemberSpec, PluginAddress, ReadyBlock, RecordRepr,
    RecordSpec, TableRepr,
};
use urom_wire::oob::OobRepr;
use urom_wire::{FrameRepr, MaxMsgSize};

fn check(bytes: &[u8], emit: impl Fn(&mut [u8]) -> usize) {
    let mut out = vec![0xa5; bytes.len() + 1];
    let written = emit(&mut out);
    assert_eq!(&out[..written], bytes);
    assert_eq!(out[written], 0xa5, "wrote past its end");
}

/// Writes a parsed record again from what its iterators give.
fn re_emit(record: &RecordRepr<'_>, out: &mut [u8]) -> usize {
    let plugins: Vec<Vec<PluginAddress<'_>>> =
        record.members().map(|m| m.plugins().collect()).collect();
    let members: Vec<MemberSpec<'_>> = record
        .members()
        .zip(&plugins)
        .map(|(m, plugins)| MemberSpec {
            domain_id: m.domain_id,
            plugins,
        })
        .collect();
    let buffers: Vec<Buffer<'_>> = record.buffers().collect();
    RecordSpec {
        rank: record.rank,
        members: &members,
        buffers: &buffers,
    }
    .emit(out)
    .expect("a parsed record emits again")
}

fuzz_target!(|data: &[u8]| {
    let max = MaxMsgSize::DEFAULT;
    if let Ok(frame) = FrameRepr::<DomainMessage>::parse(data, max) {
        check(data, |buf| {
            frame.emit(buf, max).expect("a parsed frame emits again")
        });
    }
    if let Ok(record) = RecordRepr::parse(data) {
        check(data, |buf| re_emit(&record, buf));
    }
    if let Ok(table) = TableRepr::parse(data) {
        let records: Vec<&[u8]> = table.records().map(|r| r.as_bytes()).collect();
        assert_eq!(records.len(), table.ranks as usize);
        check(data, |buf| {
            TableRepr::emit(&records, buf).expect("a parsed table emits again")
        });
        for record in table.records() {
            let mut out = vec![0; record.as_bytes().len()];
            re_emit(&record, &mut out);
            assert_eq!(out, record.as_bytes());
        }
    }
    if let Ok(block) = JoinBlock::parse(data) {
        check(data, |buf| {
            block.emit(buf).expect("a parsed block emits again")
        });
    }
    if let Ok(block) = ReadyBlock::parse(data) {
        check(data, |buf| {
            block.emit(buf).expect("a parsed block emits again")
        });
    }
    if let Ok(message) = OobRepr::parse(data, 1 << 20) {
        check(data, |buf| {
            message.emit(buf).expect("a parsed message emits again")
        });
    }
});
