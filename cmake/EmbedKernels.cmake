# Embeds the device headers under kernels/ into the library, so that an installed qgemm needs no
# include path at run time. The generated file defines qgemm::jit::embedded_headers(): each
# header's path relative to kernels/ and its text, sorted by path.
function(qgemm_embed_kernels out_var)
  set(output ${CMAKE_CURRENT_BINARY_DIR}/embedded_kernels.cpp)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DKERNEL_DIR=${CMAKE_CURRENT_SOURCE_DIR}/kernels -DOUTPUT=${output}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/WriteEmbeddedKernels.cmake
    DEPENDS ${ARGN} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/WriteEmbeddedKernels.cmake
    COMMENT "Embedding device headers"
    VERBATIM)
  set(${out_var} ${output} PARENT_SCOPE)
endfunction()
