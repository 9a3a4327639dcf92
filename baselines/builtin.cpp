// The list of built-in policies (see builtin.h).
#include "baselines/builtin.h"

#include "baselines/apex.h"
#include "baselines/cerebras.h"
#include "baselines/deepspeed.h"
#include "baselines/jmp.h"
#include "baselines/keras.h"
#include "baselines/megatron.h"
#include "baselines/none.h"
#include "baselines/popart_als.h"
#include "baselines/static.h"
#include "baselines/te_delayed.h"
#include "baselines/torch.h"

namespace gradscale::baselines {

std::vector<BuiltinScaler> builtin_scalers() {
  return {
      {"none", make_none_scaler},
      {"static", make_static_scaler},
      {"torch", make_torch_scaler},
      {"deepspeed", make_deepspeed_scaler},
      {"megatron", make_megatron_scaler},
      {"apex", make_apex_scaler},
      {"keras", make_keras_scaler},
      {"jmp", make_jmp_scaler},
      {"cerebras", make_cerebras_scaler},
      {"popart_als", make_popart_als_scaler},
      {"te_delayed", make_te_delayed_scaler, ScalerKind::per_layer},
  };
}

}  // namespace gradscale::baselines
