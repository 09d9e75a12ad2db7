// A test extension that forgot its entry point.
extern "C" int kiln_test_not_an_entry_point() { return 42; }
