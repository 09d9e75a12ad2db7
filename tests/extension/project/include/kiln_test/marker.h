#pragma once
// Found only through Kiln::kiln's include directories.
#define KILN_TEST_MARKER 1
