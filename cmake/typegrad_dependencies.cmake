# Shared by the build tree and the installed typegradConfig.cmake.
find_package(Boost 1.74 REQUIRED)            # Boost::headers (Hana)
if(NOT TARGET xsimd)
  find_package(xsimd 8 REQUIRED)
  # Debian's xsimd package links "xtl", which bookworm does not ship: xsimd needs nothing to link.
  if(NOT TARGET xtl)
    set_target_properties(xsimd PROPERTIES INTERFACE_LINK_LIBRARIES "")
  endif()
endif()
