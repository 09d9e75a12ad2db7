int kiln_test_host() { return 1; }
