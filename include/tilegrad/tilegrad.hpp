// tilegrad: Triton-style tile kernels on the CPU, written once as generic C++ over a scalar type.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/shape_ops.hpp"
#include "tilegrad/tile/tile.hpp"
