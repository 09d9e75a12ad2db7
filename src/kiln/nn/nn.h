#pragma once
// Everything in nn/: Module, the layers, containers and initialisers.
#include "kiln/nn/containers.h"
#include "kiln/nn/graph_safe_random.h"
#include "kiln/nn/init.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
