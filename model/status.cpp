#include "model/status.h"

#include "model/py/key.h"

namespace ckptsim {

Status Status::on_one_line() const {
  return Status(code_, model::escape_control_characters(message_));
}

}  // namespace ckptsim
