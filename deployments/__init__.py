"""Ray Serve deployments: one thin class per file, composed by ``serve_app.app.build_app``.

The classes carry no decorator: the builder deploys them with the options their
``get_deployment_options`` returns, overridden per deployment name by the Serve config file.
"""
