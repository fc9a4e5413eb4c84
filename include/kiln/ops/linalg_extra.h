// The former name of kiln/ops/linalg.h, kept so that code including it still builds.
#pragma once

#include "kiln/ops/linalg.h"
