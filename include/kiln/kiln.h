// kiln: build, compile and run machine-learning compute graphs.
#pragma once

#include "kiln/array.h"
#include "kiln/attrs.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/autodiff.h"
#include "kiln/executable.h"
#include "kiln/graph.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/loss.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "kiln/version.h"
