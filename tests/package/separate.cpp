#include <tilegrad/separate.hpp>
