use urom_host::State;

// Only urom's own lifecycle states exist.
struct Paused;
impl State for Paused {}

fn main() {}
