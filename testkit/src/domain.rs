//! Domain tables for tests that hand a worker or a plugin a table of their own making.

use urom_core::wire::domain::{RecordSpec, TableRepr};

/// The table bytes of `records`, in rank order as given (what a host sends its workers).
pub fn table_bytes(records: &[RecordSpec<'_>]) -> Vec<u8> {
    let records: Vec<Vec<u8>> = records
        .iter()
        .map(|spec| {
            let mut bytes = vec![0; spec.buffer_len()];
            spec.emit(&mut bytes).expect("a record fits its own length");
            bytes
        })
        .collect();
    let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let mut table = vec![0; TableRepr::buffer_len(&slices)];
    TableRepr::emit(&slices, &mut table).expect("a table fits its own length");
    table
}
