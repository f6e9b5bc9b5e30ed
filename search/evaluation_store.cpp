#include "search/evaluation_store.hpp"
