# ctest model_files_match_the_runner: the plan and the trace ckptsim writes, checked by the replay
# runner's own (Python) readers: its schema validators, its base64 decoder and FNV-1a hash (every
# hashed array of a --trace-values trace must hash to its entry), and its check that every run's
# local gradients sum to the same totals at every global step. Two implementations of one
# format, so a byte-order or rounding slip on either side shows here.
# Variables: CKPTSIM (the binary), PYTHON, SOURCE (the repository), WORK (a scratch folder).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
foreach(scenario bug2-step-reset-dp2-to-4 bug1-duplicate-leaf-dp2-to-2 spec17-J-lno-lno-offload-half
                fused-adam-save-before-first-step-miles-main)
  set(s ${SOURCE}/scenarios/${scenario}.json)
  execute_process(COMMAND ${CKPTSIM} run --memory --quiet --trace-json ${WORK}/${scenario}.trace.json
                          --trace-values ${s} RESULT_VARIABLE rc)
  if(NOT rc MATCHES "^[01]$")
    message(FATAL_ERROR "ckptsim run --trace-json ${scenario}: exit ${rc}")
  endif()
  execute_process(COMMAND ${CKPTSIM} replay-plan ${s} -o ${WORK}/${scenario}.plan.json
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ckptsim replay-plan ${scenario}: exit ${rc}")
  endif()
endforeach()
file(GLOB traces ${WORK}/*.trace.json)
file(GLOB plans ${WORK}/*.plan.json)
execute_process(COMMAND ${PYTHON} -m replay validate-trace ${traces} WORKING_DIRECTORY ${SOURCE}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python -m replay validate-trace: exit ${rc}")
endif()
execute_process(COMMAND ${PYTHON} -m replay validate-plan --check-grads ${plans}
                WORKING_DIRECTORY ${SOURCE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python -m replay validate-plan --check-grads: exit ${rc}")
endif()
message(STATUS "every trace and plan is valid to the replay runner")
