// The former name of kiln/ops/rearrange.h, kept so that code including it still builds.
#pragma once

#include "kiln/ops/rearrange.h"
