#pragma once
// Evaluating a classifier on a device-resident uint8 image set: loss, accuracy and, on request,
// every prediction with its confidence (for confusion matrices and the prediction grid).
#include <cstdint>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/tensor/tensor.h"
#include "kiln/vision/augment_params.h"

namespace kiln::train {

struct ClassifierEval {
  double loss = 0;
  double accuracy = 0;                    // fraction
  std::vector<std::int64_t> predictions;  // filled when asked
  std::vector<float> confidences;         // softmax probability of the prediction
};

// images uint8 [N, C, H, W] and labels int64 [N] on the model's device; `normalize` carries the
// mean/std (pad/flip are ignored: evaluation never augments). Runs in eval mode, without grad.
ClassifierEval evaluate_classifier(nn::UnaryModule& model, const Tensor& images, const Tensor& labels,
                                   const vision::AugmentParams& normalize, int batch_size, bool keep_predictions,
                                   bool amp_bf16 = false);

}  // namespace kiln::train
