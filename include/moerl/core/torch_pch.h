#pragma once
// The one precompiled header of the LibTorch translation units. torch/torch.h
// costs ~13 s to parse; precompiling it once keeps each TU that needs it cheap.
// Code outside src/{model,moe,rollout,algo,learner,sync} must not include it.
#include <torch/torch.h>
