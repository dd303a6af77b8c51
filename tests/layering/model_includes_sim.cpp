// The deliberate upward include of the test `layering_upward_include_fails`: a source compiled
// with the model layer's include path that includes a header of the simulator, a layer above.
// It must not compile: model/ never sees sim/ (CMakeLists.txt, ckptsim_layer_includes).
#include "sim/driver.h"
