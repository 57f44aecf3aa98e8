"""``python -m vq_token TYPE ID USER TOKEN``: the verdict as JSON (see ``vq_token.main``)."""

from vq_token import main

raise SystemExit(main())
