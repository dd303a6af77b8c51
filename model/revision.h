// placeholder; replaced below
#pragma once
#include <string>
#include <vector>
namespace ckptsim::model {
struct EmbeddedProfile { const char* path; const char* json; };
const std::vector<EmbeddedProfile>& embedded_revision_profiles();
}
