#include "tpu_nodes/model/tpu_model.hpp"
