//! Methods that are wrong in a context's state do not exist in that state: each file under
//! `tests/ui` must fail to compile, with the error recorded beside it.

#[test]
fn methods_that_are_wrong_in_a_state_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
