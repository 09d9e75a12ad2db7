#include "kiln/train/classifier_eval.h"

#include <algorithm>

#include "kiln/autograd/functions.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/vision/image_augment.h"

namespace kiln::train {

ClassifierEval evaluate_classifier(nn::UnaryModule& model, const Tensor& images, const Tensor& labels,
                                   const vision::AugmentParams& normalize, int batch_size, bool keep_predictions,
                                   bool amp_bf16) {
  KILN_CHECK(batch_size > 0, "evaluate_classifier: the batch size must be positive, got {}", batch_size);
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  vision::AugmentParams plain = normalize;
  plain.pad = 0;
  plain.flip = false;
  const std::int64_t n = images.shape()[0];
  Device device = images.device();
  Tensor loss_sum = Tensor::zeros({}, DType::F32, device);
  Tensor correct = Tensor::zeros({}, DType::I64, device);
  Tensor all_idx = Tensor::arange(0, static_cast<double>(n), 1, DType::I64, device);
  ClassifierEval out;
  for (std::int64_t start = 0; start < n; start += batch_size) {
    std::int64_t end = std::min<std::int64_t>(n, start + batch_size);
    Tensor idx = all_idx.slice(0, start, end);
    Tensor x = vision::augment_images(images, idx, plain);
    Tensor y = labels.slice(0, start, end);
    Tensor logits;
    {
      AutocastGuard autocast(DType::BF16, amp_bf16);
      logits = model.forward(x);
    }
    logits = logits.to(DType::F32);
    loss_sum.add_(mul(cross_entropy(logits, y), static_cast<double>(end - start)));
    Tensor pred = argmax(logits, 1);
    correct.add_(sum(eq(pred, y).to(DType::I64)));
    if (keep_predictions) {
      auto p = pred.to_vector<std::int64_t>();
      auto probs = softmax(logits, 1);
      auto conf = amax(probs, {1}).to_vector<float>();
      out.predictions.insert(out.predictions.end(), p.begin(), p.end());
      out.confidences.insert(out.confidences.end(), conf.begin(), conf.end());
    }
  }
  out.loss = loss_sum.item() / static_cast<double>(std::max<std::int64_t>(n, 1));
  out.accuracy = correct.item() / static_cast<double>(std::max<std::int64_t>(n, 1));
  model.train(was_training);
  return out;
}

}  // namespace kiln::train
