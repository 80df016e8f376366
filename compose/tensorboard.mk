# TensorBoard of the stack: the service comes up with `make up` (compose.generate); this captures traces.
# Included by the top Makefile after compose/compose.mk (LIFECYCLE, RUN_DIR, PYTHON).

PROFILE_SECONDS ?= 2
PROFILE_KEEP ?= 5

$(call pass_env,profile,RUN_DIR PROFILE_SECONDS PROFILE_KEEP)

##@ TensorBoard

.PHONY: profile
profile: ## Trace every task at once for PROFILE_SECONDS (2), keep PROFILE_KEEP (5) (docs/tensorboard.md)
	@args=$$("$$PYTHON" -m compose.profile --run-dir "$$RUN_DIR" --seconds "$$PROFILE_SECONDS" --keep "$$PROFILE_KEEP") \
	  && $(LIFECYCLE) compose exec -T $$args

BROWSER_PACKAGES := chromium chromium-driver

.PHONY: browser
browser: ## Install headless Chromium and its WebDriver from Debian's packages (TensorBoard test; root, apt)
	@missing=$$(for p in $(BROWSER_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	 if [ -n "$$missing" ]; then echo "browser: apt-get install $$missing"; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	@chromium --version
